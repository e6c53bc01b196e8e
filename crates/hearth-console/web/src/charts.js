// A sandbox's CPU and memory over time, as its host measures them (`GET
// /boxes/{name}/metrics`, polled every two seconds while the page is
// open), drawn with uPlot; the latest figures and the egress counters as
// text beside them (the charts' text alternative too).

import { h } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import htm from "htm";
import uPlot from "uplot";
import { api, boxes, enc } from "./api.js";

const html = htm.bind(h);
const KEEP = 300; // points: ten minutes at one every two seconds
const MiB = 1024 * 1024;

function chart(element, label, stroke, width) {
  return new uPlot(
    {
      width,
      height: 160,
      legend: { show: false },
      cursor: { show: false },
      scales: { x: { time: true }, y: { range: (_u, _min, max) => [0, Math.max(1, max * 1.2)] } },
      axes: [
        { stroke: "currentColor", grid: { stroke: "rgba(128,128,128,0.2)" } },
        { stroke: "currentColor", grid: { stroke: "rgba(128,128,128,0.2)" }, size: 56 },
      ],
      series: [{}, { label, stroke, width: 2, fill: `${stroke}22` }],
    },
    [[], []],
    element,
  );
}

function size(n) {
  if (n == null) return "–";
  if (n >= 1024 * MiB) return `${(n / (1024 * MiB)).toFixed(2)} GiB`;
  if (n >= MiB) return `${(n / MiB).toFixed(1)} MiB`;
  if (n >= 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${n} B`;
}

export function Usage({ name }) {
  const cpuRef = useRef(null);
  const memRef = useRef(null);
  const [latest, setLatest] = useState(null);
  const [error, setError] = useState(null);
  useEffect(() => {
    const width = () => Math.max(240, Math.min(560, cpuRef.current.parentElement.clientWidth - 24));
    const cpu = chart(cpuRef.current, "CPU %", "#d9480f", width());
    const mem = chart(memRef.current, "Memory MiB", "#1c7ed6", width());
    const t = [];
    const cpuPct = [];
    const memMiB = [];
    let previous = null;
    let live = true;
    let timer = null;
    const poll = async () => {
      try {
        const m = await api("GET", `${boxes}/${enc(name)}/metrics`);
        if (!live) return;
        const now = Date.parse(m.measured_at) / 1000;
        if (m.running && previous && now > previous.at && m.cpu_seconds_total >= previous.cpu) {
          t.push(now);
          cpuPct.push((100 * (m.cpu_seconds_total - previous.cpu)) / (now - previous.at));
          memMiB.push(m.memory_bytes / MiB);
          if (t.length > KEEP) {
            t.shift();
            cpuPct.shift();
            memMiB.shift();
          }
          cpu.setData([t, cpuPct]);
          mem.setData([t, memMiB]);
        }
        previous = m.running ? { at: now, cpu: m.cpu_seconds_total } : null;
        setLatest({ ...m, cpuPct: cpuPct.length ? cpuPct[cpuPct.length - 1] : null });
        setError(null);
      } catch (e) {
        if (live) setError(e.message);
      }
      if (live) timer = setTimeout(poll, 2000);
    };
    poll();
    const resize = new ResizeObserver(() => {
      cpu.setSize({ width: width(), height: 160 });
      mem.setSize({ width: width(), height: 160 });
    });
    resize.observe(cpuRef.current.parentElement);
    return () => {
      live = false;
      clearTimeout(timer);
      resize.disconnect();
      cpu.destroy();
      mem.destroy();
    };
  }, [name]);
  const zero = { bytes_out: 0, bytes_in: 0, connections_allowed: 0, connections_refused: 0, dns_queries: 0, dns_refused: 0 };
  // A running sandbox without counters has not used the network yet.
  const e = latest && (latest.egress || (latest.running ? zero : null));
  return html`<div class="card usage">
    <h2>Usage</h2>
    <p class="hint">As the host measures the sandbox's VM from outside: CPU as a percentage of one core, resident memory.</p>
    ${error && html`<p class="alert" role="alert">${error}</p>`}
    <div class="charts">
      <figure>
        <figcaption>CPU: <strong class="usage-cpu">${latest && latest.cpuPct != null ? `${latest.cpuPct.toFixed(1)} %` : "–"}</strong>
          <span class="hint"> of one core (${latest ? latest.vcpus : "?"} vCPU)</span></figcaption>
        <div ref=${cpuRef} role="img" aria-label="CPU use over the last minutes"></div>
      </figure>
      <figure>
        <figcaption>Memory: <strong class="usage-mem">${latest ? size(latest.memory_bytes) : "–"}</strong>
          <span class="hint"> of ${latest ? size(latest.mem_limit_bytes) : "?"}</span></figcaption>
        <div ref=${memRef} role="img" aria-label="Resident memory over the last minutes"></div>
      </figure>
    </div>
    <dl class="facts egress">
      <dt>Egress out / in</dt><dd>${e ? `${size(e.bytes_out)} / ${size(e.bytes_in)}` : "–"}</dd>
      <dt>Connections allowed / refused</dt><dd class="usage-conns">${e ? `${e.connections_allowed} / ${e.connections_refused}` : "–"}</dd>
      <dt>DNS queries / refused</dt><dd>${e ? `${e.dns_queries} / ${e.dns_refused}` : "–"}</dd>
    </dl>
  </div>`;
}
