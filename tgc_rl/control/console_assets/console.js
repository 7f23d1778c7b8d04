// The job console: the tenant's jobs, and a job's curves, samples, events and logs, live while it runs.
// It talks to the REST API only, with the token the person pasted (kept in this tab's sessionStorage).
// Everything a job or a model wrote (names, samples, logs) goes into the page as text, never as HTML.

const api = new URL(".", document.baseURI).pathname.replace(/\/$/, "");  // the server's root path
const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#1f5fbf", "#d2691e", "#2e8b57", "#8e44ad", "#c0392b", "#7f8c8d"];
let panels = [];  // [{title, log, metrics: [{name, label}]}], from console/panels.json
let view = { stop: () => {} };

function token() { return sessionStorage.getItem("tgc-token"); }

async function call(path, options = {}) {
  const response = await fetch(api + path, {
    ...options,
    headers: { Authorization: `Bearer ${token()}`, "Content-Type": "application/json", ...(options.headers || {}) },
  });
  if (response.status === 401) { logout("The token was refused (401): log in again."); throw new Error("401"); }
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail || detail; } catch (e) { /* not JSON */ }
    throw new Error(`${response.status}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`);
  }
  return response.status === 204 ? null : response.json();
}

function el(tag, text, attrs = {}) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

function fmt(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v !== "number") return String(v);
  return Math.abs(v) >= 1e4 || (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(2) : String(+v.toPrecision(3));
}

function show(section) {
  for (const id of ["login", "list", "job"]) $(id).hidden = id !== section;
  $("logout").hidden = section === "login";
  $("error").textContent = "";
}

function logout(message = "") {
  sessionStorage.removeItem("tgc-token");
  view.stop();
  show("login");
  $("login-error").textContent = message;
}

// -- the list of jobs ----------------------------------------------------------------------------------
async function renderList() {
  show("list");
  const body = $("jobs").querySelector("tbody");
  let timer = null;
  let stopped = false;
  const refresh = async () => {
    if (stopped) return;
    try {
      const page = await call("/v1/jobs?limit=100");
      body.replaceChildren(...page.jobs.map((job) => {
        const row = el("tr", null, { "data-job": job.id });
        row.append(el("td", job.name), el("td", job.id), el("td", job.state, { class: `state-${job.state}` }),
          el("td", `${job.step ?? 0}/${job.total_steps}`), el("td", fmt(job.latest_metrics["reward/mean"])),
          el("td", new Date(job.updated_at).toLocaleString()));
        row.addEventListener("click", () => { location.hash = `#/jobs/${job.id}`; });
        return row;
      }));
      $("no-jobs").hidden = page.jobs.length > 0;
    } catch (e) { $("error").textContent = e.message; }
    if (!stopped) timer = setTimeout(refresh, 3000);
  };
  await refresh();
  return { stop: () => { stopped = true; clearTimeout(timer); } };
}

// -- one job -----------------------------------------------------------------------------------------------
function chart(panel, points) {
  const box = el("div", null, { class: "chart", "data-panel": panel.title });
  box.append(el("h3", panel.title + (panel.log ? " (log10)" : "")));
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", "0 0 400 160");
  svg.setAttribute("preserveAspectRatio", "none");
  const series = panel.metrics.map((m) => ({
    ...m,
    xy: points.filter((p) => typeof p.metrics[m.name] === "number")
      .map((p) => [p.step, panel.log ? Math.log10(Math.max(Math.abs(p.metrics[m.name]), 1e-12)) : p.metrics[m.name]]),
  })).filter((s) => s.xy.length);
  const all = series.flatMap((s) => s.xy);
  const legend = el("div", null, { class: "legend" });
  if (all.length) {
    const [x0, x1] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
    let [y0, y1] = [Math.min(...all.map((p) => p[1])), Math.max(...all.map((p) => p[1]))];
    if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
    const sx = (x) => 8 + (x1 === x0 ? 192 : ((x - x0) / (x1 - x0)) * 384);
    const sy = (y) => 152 - ((y - y0) / (y1 - y0)) * 144;
    series.forEach((s, i) => {
      const line = document.createElementNS(SVG, "polyline");
      line.setAttribute("points", s.xy.map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" "));
      line.setAttribute("fill", "none");
      line.setAttribute("stroke", COLORS[i % COLORS.length]);
      line.setAttribute("stroke-width", "1.5");
      line.setAttribute("vector-effect", "non-scaling-stroke");
      line.dataset.metric = s.name;
      line.dataset.points = String(s.xy.length);
      svg.append(line);
      const last = s.xy[s.xy.length - 1][1];
      const label = el("span", `${s.label}: ${fmt(panel.log ? 10 ** last : last)}`);
      label.style.color = COLORS[i % COLORS.length];
      legend.append(label);
    });
    const axis = el("span", `steps ${x0}–${x1}; ${fmt(panel.log ? 10 ** y0 : y0)} … ${fmt(panel.log ? 10 ** y1 : y1)}`);
    legend.append(axis);
  } else {
    legend.append(el("span", "no data yet"));
  }
  box.append(svg, legend);
  return box;
}

function sampleBox(s) {
  const box = el("div", null, { class: "sample", "data-step": s.step });
  box.append(
    el("div", `step ${s.step} · group ${s.group} · #${s.index} · reward ${fmt(s.reward)} · advantage ` +
      `${fmt(s.advantage)} · ${s.length} tokens · ${s.finish_reason} · ${s.selected.join(", ")}`, { class: "meta" }),
    el("pre", s.prompt, { class: "prompt" }),
    el("pre", s.response, { class: "response" }),
  );
  if (s.detail) box.append(el("div", s.detail, { class: "meta" }));
  return box;
}

async function renderJob(id) {
  show("job");
  const ctl = new AbortController();
  let timer = null;
  let pending = null;
  let stepFollowsLatest = true;
  const slider = $("sample-step");

  const loadJob = async () => {
    const job = await call(`/v1/jobs/${id}`);
    $("job-name").textContent = `${job.name} (${job.id})`;
    $("job-state").textContent = job.state;
    $("job-state").className = `state-${job.state}`;
    $("job-step").textContent = `${job.step ?? 0}/${job.total_steps}`;
    $("job-progress").value = job.total_steps ? (job.step ?? 0) / job.total_steps : 0;
    $("job-reason").textContent = job.reason;
    $("cancel").hidden = ["succeeded", "failed", "cancelled"].includes(job.state) || job.cancel_requested;
    return job;
  };
  const loadCurves = async () => {
    const series = await call(`/v1/jobs/${id}/metrics`);
    $("charts").replaceChildren(...panels.map((p) => chart(p, series.points)));
  };
  const loadSamples = async () => {
    const worst = $("sample-worst").checked ? "&selected=worst" : "";
    const probe = await call(`/v1/jobs/${id}/samples?limit=1`);
    const last = probe.last_step;
    if (last === null || last === undefined) {
      $("samples").replaceChildren(el("p", "No samples yet."));
      $("sample-step-label").textContent = "";
      return;
    }
    slider.max = String(last);
    if (stepFollowsLatest) slider.value = String(last);
    $("sample-step-label").textContent = `${slider.value} of ${last}`;
    const page = await call(`/v1/jobs/${id}/samples?step=${slider.value}&limit=50${worst}`);
    $("samples").replaceChildren(...page.samples.map(sampleBox));
  };
  const loadLogs = async () => {
    const page = await call(`/v1/jobs/${id}/logs?limit=200`);
    $("events").replaceChildren(...page.lines.slice(-200).map((l) => el("li", `${l.time} ${l.level} ${l.message}`)));
  };
  const refresh = async () => {
    try {
      const job = await loadJob();
      await Promise.all([loadCurves(), loadSamples(), loadLogs()]);
      return job;
    } catch (e) { if (e.message !== "401") $("error").textContent = e.message; }
  };
  const soon = () => { if (!pending) pending = setTimeout(async () => { pending = null; await refresh(); }, 700); };

  slider.oninput = () => { stepFollowsLatest = slider.value === slider.max; loadSamples(); };
  $("sample-worst").onchange = () => loadSamples();
  $("cancel").onclick = async () => {
    $("cancel").disabled = true;
    try {
      await call(`/v1/jobs/${id}/cancel`, { method: "POST", body: JSON.stringify({ reason: "cancelled from the console" }) });
      await loadJob();
    } catch (e) { $("error").textContent = e.message; }
    $("cancel").disabled = false;
  };

  const job = await refresh();
  // Live: the job's event stream (server-sent events over fetch, which can send the token), polling as fallback.
  const follow = async () => {
    let since = 0;
    while (!ctl.signal.aborted) {
      try {
        const response = await fetch(`${api}/v1/jobs/${id}/events?since=${since}`, {
          headers: { Authorization: `Bearer ${token()}`, Accept: "text/event-stream" }, signal: ctl.signal,
        });
        if (!response.ok) throw new Error(`events: ${response.status}`);
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value;
          let cut;
          while ((cut = buffer.indexOf("\n\n")) >= 0) {
            const block = buffer.slice(0, cut);
            buffer = buffer.slice(cut + 2);
            const id_ = block.match(/^id: (\d+)$/m);
            if (id_) since = Math.max(since, Number(id_[1]));
            if (/^event: end$/m.test(block)) { await refresh(); return; }
            if (/^event: /m.test(block)) soon();
          }
        }
      } catch (e) {
        if (ctl.signal.aborted) return;
      }
      await new Promise((r) => { timer = setTimeout(r, 3000); });  // reconnect after the stream's lifetime
      soon();
    }
  };
  if (job && !["succeeded", "failed", "cancelled"].includes(job.state)) follow();
  return { stop: () => { ctl.abort(); clearTimeout(timer); clearTimeout(pending); } };
}

// -- routing -------------------------------------------------------------------------------------------------
let routes = 0;  // a newer route supersedes one still loading

async function route() {
  const mine = ++routes;
  view.stop();
  view = { stop: () => {} };
  if (!token()) { show("login"); return; }
  const match = location.hash.match(/^#\/jobs\/([\w-]+)$/);
  const next = match ? await renderJob(match[1]) : await renderList();
  if (mine === routes) view = next; else next.stop();
}

$("login").addEventListener("submit", async (event) => {
  event.preventDefault();
  sessionStorage.setItem("tgc-token", $("token").value.trim());
  $("token").value = "";
  $("login-error").textContent = "";
  await route();
});
$("logout").addEventListener("click", () => logout());
window.addEventListener("hashchange", route);

panels = await (await fetch("console/panels.json")).json();
await route();
