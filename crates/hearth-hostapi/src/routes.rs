//! The host API's routes: the one table the host's router
//! (`hearth_host::api::router`) and its client ([`crate::RemoteHost`]) are
//! both written from, so the two cannot name a route differently.

use hearth_types::VmId;

/// A route of the host's private API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HostRoute {
    Health,
    Status,
    ListVms,
    VmChanges,
    GetVm,
    CreateVm,
    DeleteVm,
    StartVm,
    StopVm,
    ForgetVm,
    ClaimVm,
    SetNetwork,
    Capture,
    Guest,
    ImportImage,
    DeleteSnapshot,
    CopyVolume,
    CollectGarbage,
}

impl HostRoute {
    pub const ALL: [HostRoute; 18] = [
        HostRoute::Health,
        HostRoute::Status,
        HostRoute::ListVms,
        HostRoute::VmChanges,
        HostRoute::GetVm,
        HostRoute::CreateVm,
        HostRoute::DeleteVm,
        HostRoute::StartVm,
        HostRoute::StopVm,
        HostRoute::ForgetVm,
        HostRoute::ClaimVm,
        HostRoute::SetNetwork,
        HostRoute::Capture,
        HostRoute::Guest,
        HostRoute::ImportImage,
        HostRoute::DeleteSnapshot,
        HostRoute::CopyVolume,
        HostRoute::CollectGarbage,
    ];

    /// The HTTP method and the path pattern (`{id}`: the VM's id).
    pub const fn method_and_pattern(self) -> (&'static str, &'static str) {
        match self {
            HostRoute::Health => ("GET", "/healthz"),
            HostRoute::Status => ("GET", "/v1/status"),
            HostRoute::ListVms => ("GET", "/v1/vms"),
            // A query with a body (the cursor, signed with the command).
            HostRoute::VmChanges => ("POST", "/v1/vm-changes"),
            HostRoute::GetVm => ("GET", "/v1/vms/{id}"),
            HostRoute::CreateVm => ("PUT", "/v1/vms/{id}"),
            HostRoute::DeleteVm => ("DELETE", "/v1/vms/{id}"),
            HostRoute::StartVm => ("POST", "/v1/vms/{id}/start"),
            HostRoute::StopVm => ("POST", "/v1/vms/{id}/stop"),
            HostRoute::ForgetVm => ("POST", "/v1/vms/{id}/forget"),
            HostRoute::ClaimVm => ("POST", "/v1/vms/{id}/claim"),
            HostRoute::SetNetwork => ("PUT", "/v1/vms/{id}/network"),
            HostRoute::Capture => ("POST", "/v1/vms/{id}/capture"),
            HostRoute::Guest => ("GET", "/v1/vms/{id}/guest"),
            HostRoute::ImportImage => ("POST", "/v1/images/import"),
            HostRoute::DeleteSnapshot => ("POST", "/v1/snapshots/delete"),
            HostRoute::CopyVolume => ("POST", "/v1/volumes/copy"),
            HostRoute::CollectGarbage => ("POST", "/v1/store/gc"),
        }
    }

    pub const fn method(self) -> &'static str {
        self.method_and_pattern().0
    }

    pub const fn pattern(self) -> &'static str {
        self.method_and_pattern().1
    }

    /// Whether the route is about one VM (its pattern names `{id}`).
    pub fn names_vm(self) -> bool {
        self.pattern().contains("{id}")
    }

    /// The path a client requests: the pattern with `vm` in place of
    /// `{id}`.
    pub fn path(self, vm: Option<VmId>) -> String {
        match vm {
            Some(id) => self.pattern().replace("{id}", &id.to_string()),
            None => self.pattern().to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_once_and_paths_fill_the_pattern() {
        for (i, r) in HostRoute::ALL.iter().enumerate() {
            assert!(
                !HostRoute::ALL[..i]
                    .iter()
                    .any(|o| o.method_and_pattern() == r.method_and_pattern()),
                "{r:?} twice"
            );
            let id = VmId::new();
            let path = r.path(Some(id));
            assert!(!path.contains('{'), "{path}");
            assert_eq!(path.contains(&id.to_string()), r.names_vm());
        }
    }
}
