//! The sandbox's only DNS server. A/AAAA for names the policy refuses are
//! NXDOMAIN; other names are resolved by the host (static hosts, then the
//! system) and answered with a 30 s TTL and only the addresses a connection
//! could reach (access control and the private-address gate; none left is
//! NXDOMAIN), remembering address → name so raw
//! TCP to the address can be judged by name. Other types get an empty
//! NOERROR answer. Malformed packets are dropped.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{RData, Record, RecordType};
use tokio::net::UdpSocket;

use crate::policy::NameVerdict;
use crate::{Counters, Sandbox};

const TTL: u32 = 30;
/// Larger datagrams are not queries a stub resolver sends.
const MAX_PACKET: usize = 4096;

pub async fn serve(sb: Arc<Sandbox>, socket: UdpSocket) {
    let socket = Arc::new(socket);
    let mut buf = vec![0u8; MAX_PACKET];
    loop {
        let (n, from) = match socket.recv_from(&mut buf).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(sandbox = %sb.id, error = %e, "DNS receive failed");
                continue;
            }
        };
        let Ok(permit) = sb.dns_slots.clone().try_acquire_owned() else {
            continue; // too many in flight: the client retries
        };
        let packet = buf[..n].to_vec();
        let (sb, socket) = (sb.clone(), socket.clone());
        tokio::spawn(async move {
            if let Some(reply) = answer(&sb, &packet).await {
                let _ = socket.send_to(&reply, from).await;
            }
            drop(permit);
        });
    }
}

/// The reply to one datagram, or `None` to drop it.
pub(crate) async fn answer(sb: &Sandbox, packet: &[u8]) -> Option<Vec<u8>> {
    let req = Message::from_vec(packet).ok()?;
    if req.message_type() != MessageType::Query {
        return None;
    }
    let mut resp = Message::new();
    resp.set_id(req.id())
        .set_message_type(MessageType::Response)
        .set_op_code(req.op_code())
        .set_recursion_desired(req.recursion_desired())
        .set_recursion_available(true);
    let [query] = req.queries() else {
        resp.set_response_code(ResponseCode::FormErr);
        return resp.to_vec().ok();
    };
    resp.add_query(query.clone());
    if req.op_code() != OpCode::Query {
        resp.set_response_code(ResponseCode::NotImp);
        return resp.to_vec().ok();
    }
    Counters::inc(&sb.counters.dns_queries);
    let qtype = query.query_type();
    if qtype != RecordType::A && qtype != RecordType::AAAA {
        return resp.to_vec().ok();
    }
    let qname = query.name().clone();
    let ascii = qname.to_ascii();
    let name = ascii.trim_end_matches('.');
    let policy = sb.policy();
    let verdict = policy.name_verdict(name);
    if let NameVerdict::Refused(_) = verdict {
        Counters::inc(&sb.counters.dns_refused);
        resp.set_response_code(ResponseCode::NXDomain);
        return resp.to_vec().ok();
    }
    let addrs: Vec<SocketAddr> = match sb.shared.resolve(name, 0).await {
        Ok(a) => a,
        Err(_) => {
            resp.set_response_code(ResponseCode::NXDomain);
            return resp.to_vec().ok();
        }
    };
    let mut ips: Vec<IpAddr> = Vec::new();
    for a in addrs {
        let ip = a.ip().to_canonical();
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    // Only addresses a connection could reach are worth answering, judged
    // as the proxy judges a connection (access control, then the
    // private-address gate): the others would only tell the guest what the
    // operator's static hosts, the host's own names and its networks hold.
    ips.retain(|ip| sb.check_ip(&policy, Some(name), *ip).is_ok());
    if ips.is_empty() {
        Counters::inc(&sb.counters.dns_refused);
        resp.set_response_code(ResponseCode::NXDomain);
        return resp.to_vec().ok();
    }
    for ip in ips {
        let rdata = match (qtype, ip) {
            (RecordType::A, IpAddr::V4(v4)) => RData::A(A(v4)),
            (RecordType::AAAA, IpAddr::V6(v6)) => RData::AAAA(AAAA(v6)),
            _ => continue,
        };
        sb.remember_name(ip, name);
        resp.add_answer(Record::from_rdata(qname.clone(), TTL, rdata));
    }
    resp.to_vec().ok()
}
