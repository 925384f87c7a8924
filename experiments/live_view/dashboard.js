// spikeloop live view: builds the panels from /layout.json, then follows /events (one state per tick).
"use strict";

const $ = (id) => document.getElementById(id);
let layout = null;
let lastEventAt = 0;
let spikeScale = 1;  // a slowly decaying maximum, so that bars stay comparable between ticks

function text(id, value) {
  const el = $(id);
  if (el) el.textContent = value === null || value === undefined ? "\u2013" : String(value);
}

function bar(cls) {
  const outer = document.createElement("div");
  outer.className = "bar " + cls;
  outer.appendChild(document.createElement("div"));
  return outer;
}

function cell(row, content, cls) {
  const td = document.createElement("td");
  if (cls) td.className = cls;
  if (content instanceof Node) td.appendChild(content); else td.textContent = content;
  row.appendChild(td);
  return td;
}

function buildPanels() {
  text("runner", layout.runner);
  text("device", layout.device || "?");
  const stim = $("stim").tBodies[0];
  layout.encoding_electrodes.forEach((electrode, i) => {
    const row = stim.insertRow();
    cell(row, electrode);
    cell(row, "\u2013", "num").id = "stim-freq-" + i;
    cell(row, bar("freq")).id = "stim-freq-bar-" + i;
    cell(row, "\u2013", "num").id = "stim-amp-" + i;
    cell(row, bar("amp")).id = "stim-amp-bar-" + i;
  });
  const spikes = $("spikes").tBodies[0];
  Object.keys(layout.spike_groups).forEach((name, i) => {
    const row = spikes.insertRow();
    cell(row, name.replace(/_/g, " "));
    cell(row, "\u2013", "num").id = "spike-" + i;
    cell(row, bar("spk")).id = "spike-bar-" + i;
    cell(row, "\u2013", "num").id = "spike-decoder-" + i;
  });
  const mea = $("mea");
  const fb = layout.feedback_electrodes;
  for (let e = 0; e < layout.grid_side * layout.grid_side; e++) {
    const d = document.createElement("div");
    d.id = "mea-" + e;
    d.textContent = e;
    if (layout.forbidden_electrodes.includes(e)) d.classList.add("forbidden");
    if (fb.positive.includes(e)) d.classList.add("fb-pos");
    else if (fb.negative.includes(e)) d.classList.add("fb-neg");
    else if (Object.values(fb).some((list) => list.includes(e))) d.classList.add("fb-event");
    mea.appendChild(d);
  }
}

function setBar(id, fraction) {
  const inner = $(id).querySelector(".bar > div");
  inner.style.width = (100 * Math.max(0, Math.min(1, fraction))).toFixed(1) + "%";
}

function fraction(value, range) {
  return (value - range[0]) / (range[1] - range[0]);
}

function update(state) {
  lastEventAt = Date.now();
  watchStatus();
  text("episodes-done", state.episodes_done);
  text("frames-encoded", state.frames.encoded);
  text("clients", state.frames.clients);
  showReturns(state.recent_returns);
  showFeedback(state.feedback || []);
  showReplies(state.replies);
  showMeter(state.meter);
  showProgress(state.progress);
  curveFollow(state.curve_last_episode || 0);
  if (!state.seq) return;
  document.body.dataset.seq = state.seq;
  text("seq", state.seq);
  const s = state.stim;
  s.frequency_hz.forEach((f, i) => {
    text("stim-freq-" + i, f.toFixed(1));
    setBar("stim-freq-bar-" + i, fraction(f, layout.frequency_range_hz));
  });
  s.amplitude_ua.forEach((a, i) => {
    text("stim-amp-" + i, a.toFixed(2));
    setBar("stim-amp-bar-" + i, fraction(a, layout.amplitude_range_ua));
  });
  const counts = state.spikes.counts;
  spikeScale = Math.max(1, 0.95 * spikeScale, ...counts);
  counts.forEach((c, i) => {
    text("spike-" + i, c.toFixed(0));
    setBar("spike-bar-" + i, c / spikeScale);
    text("spike-decoder-" + i, state.spikes.decoder_input[i].toFixed(0));
  });
  text("action", state.action.name);
  text("step-reward", state.reward.step.toFixed(2));
  text("episode-return", state.reward.episode_return.toFixed(2));
  text("episode", state.reward.episode);
  text("episode-step", state.reward.episode_step);
  text("tick-ms", state.loop.tick_ms);
  text("ticks-per-s", state.loop.ticks_per_s);
  text("stim-to-frame-ms", state.loop.stim_to_frame_ms);
  text("exchange-ok", state.loop.exchange_ok ? "yes" : "timeout");
  paintArray(s, counts);
}

function paintArray(stim, counts) {
  const freqOf = {};
  layout.encoding_electrodes.forEach((e, i) => { freqOf[e] = fraction(stim.frequency_hz[i], layout.frequency_range_hz); });
  Object.values(layout.spike_groups).forEach((electrodes, g) => {
    electrodes.forEach((e) => {
      const el = $("mea-" + e);
      if (e in freqOf) {
        el.style.background = `rgba(74,163,255,${(0.15 + 0.85 * freqOf[e]).toFixed(2)})`;
      } else {
        el.style.background = `rgba(255,165,58,${(0.1 + 0.9 * Math.min(1, counts[g] / spikeScale)).toFixed(2)})`;
      }
    });
  });
}

// One row per feedback name (reward_positive, an event, episode_negative, ...): absolute Hz and uA as sent.
function showFeedback(rows) {
  const body = $("feedback").tBodies[0];
  $("feedback-none").style.display = rows.length ? "none" : "";
  rows.forEach((r) => {
    const id = "fb-" + r.name.replace(/[^A-Za-z0-9_-]/g, "_");
    if (!$(id)) {
      const row = body.insertRow();
      row.id = id;
      cell(row, r.name.replace(/_/g, " "));
      ["sent", "mean-hz", "max-hz", "mean-ua", "max-ua", "last"].forEach((k) => {
        cell(row, "\u2013", k === "last" ? "" : "num").id = id + "-" + k;
      });
    }
    text(id + "-sent", r.sent);
    text(id + "-mean-hz", r.mean_frequency_hz.toFixed(1));
    text(id + "-max-hz", r.max_frequency_hz.toFixed(1));
    text(id + "-mean-ua", r.mean_amplitude_ua.toFixed(2));
    text(id + "-max-ua", r.max_amplitude_ua.toFixed(2));
    text(id + "-last", `${r.last_frequency_hz.toFixed(0)} / ${r.last_amplitude_ua.toFixed(2)} / ${r.last_pulses}`);
  });
}

const FOLLOWS = {
  current: "its own stim",
  mixed: "its own and an earlier stim",
  none: "no stim (no signal)",
  constant_counts: "no stim (constant)",
  constant_stim: "constant stim",
  too_few: "too few replies yet",
};

function signed(r) {
  return r === null || r === undefined ? "\u2013" : (r >= 0 ? "+" : "") + r.toFixed(2);
}

function showReplies(replies) {
  if (!replies) return;  // no culture link (the direct policy)
  const c = replies.causality;
  const late = c.verdict === "late";
  text("replies-follow", late ? `an EARLIER stim (${c.late_by} before)` : FOLLOWS[c.verdict] || c.verdict);
  $("replies-follow").classList.toggle("bad", late);
  text("causality-r", signed(c.r_current) + " / " + signed(c.r_previous));
  text("unsolicited", replies.unsolicited);
  $("unsolicited").classList.toggle("bad", replies.unsolicited > 0);
  showDose(replies.dose || {});
}

// The device's own account (its device_status at the last episode end); dashes until it has sent one.
function showDose(dose) {
  const fixed = (v) => (v === undefined ? "\u2013" : v.toFixed(2));
  text("dose-per-min", fixed(dose.device_dose_max_nc_per_min));
  text("dose-session", fixed(dose.device_dose_max_nc_session));
  const byDose = (dose.device_dose_refused_stim || 0) + (dose.device_dose_refused_feedback || 0);
  const byEnvelope = (dose.device_refused_stim || 0) + (dose.device_refused_feedback || 0);
  text("device-refused", dose.device_dose_refused_stim === undefined ? "\u2013" : `${byDose} / ${byEnvelope}`);
  $("device-refused").classList.toggle("bad", byDose + byEnvelope > 0);
}

// The live information meter: shuffle-corrected bits per tick over its window; within about 2 noise of 0 is nothing.
function showMeter(meter) {
  if (!meter || !meter.ticks) return;  // meter off, or no estimate yet
  ["stim", "features", "action"].forEach((name) => {
    const m = meter[name];  // null: a single class in the window, nothing to carry
    text("meter-" + name, m ? m.bits.toFixed(3) : "one class");
    text("meter-" + name + "-sd", m ? "\u00b1" + m.sd.toFixed(3) : null);
    text("meter-" + name + "-ceiling", m ? m.ceiling.toFixed(2) : null);
  });
  const bins = { 2: "halves", 3: "terciles", 4: "quartiles" }[meter.feature_classes] || `${meter.feature_classes} quantiles`;
  text("meter-feature", `${bins} of ${meter.feature || "its most varying feature"}`);
  text("meter-window", `over the last ${meter.ticks} ticks, as of tick ${meter.updated_at_tick}; noise: the spread ` +
    "of the estimate with the labels shuffled");
}

function showReturns(returns) {
  const box = $("returns");
  const peak = Math.max(1e-9, ...returns.map(Math.abs));
  box.replaceChildren(...returns.map((r) => {
    const d = document.createElement("div");
    d.style.height = (100 * Math.abs(r) / peak).toFixed(0) + "%";
    d.title = r.toFixed(2);
    if (r < 0) d.className = "neg";
    return d;
  }));
}

// --- Learning curve and run progress --------------------------------------------------------------
// The points come from /learning.json, fetched only when a tick says a newer episode ended; the page keeps
// them (window.spikeloopCurve, which the browser test reads) and redraws two small inline SVG plots.
const curve = { device: null, runner: null, episode: [], return: [], kills: [], window: 1, fetching: false };
window.spikeloopCurve = curve;

function curveFollow(lastEpisode) {
  const have = curve.episode.length ? curve.episode[curve.episode.length - 1] : 0;
  if (lastEpisode < have) {  // a new env runner process on this port: start over
    curve.episode = []; curve.return = []; curve.kills = [];
  } else if (lastEpisode === have || curve.fetching) {
    return;
  }
  curve.fetching = true;
  fetch("learning.json?since=" + (curve.episode.length ? curve.episode[curve.episode.length - 1] : 0), { cache: "no-store" })
    .then((r) => r.json())
    .then((got) => {
      curve.device = got.device; curve.runner = got.runner; curve.window = got.window;
      curve.episode.push(...got.episode); curve.return.push(...got.return); curve.kills.push(...got.kills);
      const over = curve.episode.length - got.keep;  // as many as the env runner keeps, the latest
      if (over > 0) ["episode", "return", "kills"].forEach((k) => curve[k].splice(0, over));
      curveDraw();
    })
    .catch(() => {})  // the next tick asks again
    .finally(() => { curve.fetching = false; });
}

function curveRolling(values, window) {
  const out = []; let sum = 0;
  values.forEach((v, i) => { sum += v; if (i >= window) sum -= values[i - window]; out.push(sum / Math.min(i + 1, window)); });
  return out;
}

const SVG = "http://www.w3.org/2000/svg";
function svgAdd(svg, tag, attrs, content) {
  const el = document.createElementNS(SVG, tag);
  Object.entries(attrs).forEach(([k, v]) => el.setAttribute(k, v));
  if (content !== undefined) el.textContent = content;
  svg.appendChild(el);
  return el;
}

// One plot: series of [values, className, asDots] over the episode numbers, y range [lo, hi], labelled axes.
function curvePlot(svg, series, lo, hi, label) {
  const W = 600, H = Number(svg.getAttribute("viewBox").split(" ")[3]), left = 38, pad = 10;
  const xs = curve.episode, x0 = xs[0], x1 = Math.max(xs[xs.length - 1], x0 + 1);
  const X = (e) => (left + (W - left - pad) * (e - x0) / (x1 - x0)).toFixed(1);
  const Y = (v) => (H - pad - (H - 2 * pad) * (v - lo) / (hi - lo || 1)).toFixed(1);
  svg.replaceChildren();
  [lo, hi].forEach((v) => {
    svgAdd(svg, "line", { class: "grid", x1: left, x2: W - pad, y1: Y(v), y2: Y(v) });
    svgAdd(svg, "text", { x: 2, y: Number(Y(v)) + 3 }, Math.abs(v) >= 100 ? v.toFixed(0) : v.toFixed(1));
  });
  if (lo < 0 && hi > 0) svgAdd(svg, "line", { class: "grid", x1: left, x2: W - pad, y1: Y(0), y2: Y(0) });
  svgAdd(svg, "text", { x: W - pad, y: H - 1, "text-anchor": "end" }, `${label} · episodes ${x0}\u2013${xs[xs.length - 1]}`);
  series.forEach(([values, cls, dots]) => {
    const d = values.map((v, i) => dots ? `M${X(xs[i])} ${Y(v)}h0` : `${i ? "L" : "M"}${X(xs[i])} ${Y(v)}`).join("");
    svgAdd(svg, "path", { class: cls, d });
  });
}

function curveDraw() {
  text("curve-device", curve.device || "?");
  text("curve-count", curve.episode.length);
  text("curve-window", curve.window);
  if (!curve.episode.length) return;
  const killed = curve.kills.map((k) => (k > 0 ? 1 : 0));
  curve.meanReturn = curveRolling(curve.return, curve.window);
  curve.killRate = curveRolling(killed, curve.window);
  const lo = Math.min(0, ...curve.return), hi = Math.max(1e-9, ...curve.return);
  curvePlot($("curve-return"), [[curve.return, "dots", true], [curve.meanReturn, "mean", false]], lo, hi, "return");
  curvePlot($("curve-kills"), [[curve.killRate, "kills", false]], 0, 1, "kill rate");
}

function progressDuration(s) {
  if (s === null || s === undefined) return "measuring\u2026";  // the pace needs two iterations
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

// What each stop condition counts (an iteration budget is shown in env steps: iterations x the train batch).
const PROGRESS_LABELS = {
  env_steps: "env steps", iterations: "env steps, \u2248 iterations", episodes: "episodes", time_s: "seconds",
};

function progressLimitText(l) {
  const n = (v) => Math.round(v).toLocaleString("en-US");
  const of = l.approximate ? "of \u2248" : "of";
  const left = l.time_left_s === null ? "" : `, about ${progressDuration(l.time_left_s)} left`;
  return `${n(l.done)} ${of} ${n(l.budget)} ${PROGRESS_LABELS[l.name]} (${(100 * l.fraction).toFixed(0)} %${left})`;
}

function showProgress(p) {
  if (!p) return;
  window.spikeloopProgress = p;
  text("progress-env-steps", p.env_steps.toLocaleString("en-US"));
  const first = p.first;
  text("progress-limit", first ? PROGRESS_LABELS[first.name] : "none set");
  text("progress-budget", first ? Math.round(first.budget).toLocaleString("en-US") : "\u2013");
  text("progress-left", first ? progressDuration(first.time_left_s) : "\u2013");
  $("progress-bar").firstElementChild.style.width = first ? (100 * first.fraction).toFixed(1) + "%" : "0";
  text("progress-limits", p.limits.map(progressLimitText).join(" \u00b7 ")
    + (p.env_steps_per_s ? ` \u00b7 ${p.env_steps_per_s} env steps/s` : ""));
}

function watchStatus() {
  const status = $("status");
  const quiet = (Date.now() - lastEventAt) / 1000;
  if (!lastEventAt) { status.textContent = "connecting\u2026"; status.className = "stale"; }
  else if (quiet < 2) { status.textContent = "live"; status.className = "ok"; }
  else { status.textContent = `no new tick for ${quiet.toFixed(0)} s (learner update, or the run ended)`; status.className = "stale"; }
}

async function start() {
  layout = await (await fetch("layout.json", { cache: "no-store" })).json();
  buildPanels();
  update(await (await fetch("state.json", { cache: "no-store" })).json());
  const events = new EventSource("events");
  events.onmessage = (msg) => update(JSON.parse(msg.data));
  setInterval(watchStatus, 500);
}

start().catch((err) => { $("status").textContent = "error: " + err; });
