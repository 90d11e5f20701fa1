// The planner page: pick a region (GET regions), draw its points (GET regions/{id}) as an SVG
// map, click to set the start, plan (POST plan) and draw the itinerary. Plain JS, no network
// beyond the planner itself. State for tests and the curious: window.planner.
"use strict";

(function () {
  const SIZE = 620, PAD = 36, SVG_NS = "http://www.w3.org/2000/svg";
  const $ = (id) => document.getElementById(id);
  const state = window.planner = {
    regions: [], region: null, detail: null, start: null, request: null, answer: null,
    busy: false, ready: false,
  };
  let view = null; // the map projection of the current region

  function setStatus(text) { $("status").textContent = text; }
  function setError(text) { $("error").textContent = text || ""; }

  async function getJSON(url, options) {
    const resp = await fetch(url, options);
    let body = null;
    try { body = await resp.json(); } catch (e) { body = null; }
    if (!resp.ok) {
      const msg = body && body.error ? body.error : `HTTP ${resp.status}`;
      const err = new Error(msg);
      err.status = resp.status;
      throw err;
    }
    return body;
  }

  function clock(minutes) {
    const total = Math.round(minutes), sign = total < 0 ? "-" : "";
    const a = Math.abs(total), h = Math.floor(a / 60), m = a % 60;
    return `${sign}${String(h).padStart(2, "0")}:${String(m).padStart(2, "0")}`;
  }

  // -- projection: region coordinates <-> SVG pixels (aspect kept; lat/lon as equirectangular)
  function makeView(detail) {
    const latlon = detail.coords === "latlon";
    const nodes = [detail.start, ...detail.points];
    const lat0 = latlon ? nodes.reduce((s, p) => s + p.lat, 0) / nodes.length : 0;
    const k = latlon ? Math.cos(lat0 * Math.PI / 180) : 1;
    const plane = (p) => latlon ? [p.lon * k, p.lat] : [p.x, p.y];
    const xs = nodes.map((p) => plane(p)[0]), ys = nodes.map((p) => plane(p)[1]);
    let [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
    const span = Math.max(x1 - x0, y1 - y0, 1e-9);
    const scale = (SIZE - 2 * PAD) / span;
    const cx = (x0 + x1) / 2, cy = (y0 + y1) / 2;
    return {
      latlon,
      toPx(p) {
        const [u, v] = plane(p);
        return [SIZE / 2 + (u - cx) * scale, SIZE / 2 - (v - cy) * scale];
      },
      fromPx(px, py) {
        const u = cx + (px - SIZE / 2) / scale, v = cy - (py - SIZE / 2) / scale;
        return latlon ? { lat: round(v, 6), lon: round(u / k, 6) } : { x: round(u, 3), y: round(v, 3) };
      },
    };
  }

  function round(v, digits) { const f = 10 ** digits; return Math.round(v * f) / f; }

  function el(name, attrs, text) {
    const node = document.createElementNS(SVG_NS, name);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function describeStart(p) {
    return view && view.latlon ? `start: ${p.lat.toFixed(5)}, ${p.lon.toFixed(5)} (lat, lon)`
      : `start: ${p.x}, ${p.y} (x, y)`;
  }

  function drawStart() {
    const [x, y] = view.toPx(state.start);
    $("start-marker").setAttribute(
      "d", `M${x - 8},${y - 8}h16v16h-16z`);
    $("start-text").textContent = describeStart(state.start);
  }

  function drawRegion(detail) {
    view = makeView(detail);
    const points = $("points"), labels = $("labels"), names = $("names");
    points.replaceChildren();
    labels.replaceChildren();
    names.replaceChildren();
    $("route").setAttribute("points", "");
    for (const p of detail.points) {
      const [x, y] = view.toPx(p);
      const c = el("circle", { cx: x.toFixed(1), cy: y.toFixed(1), r: 7, class: "poi",
        "data-node": p.node });
      c.appendChild(el("title", {}, `${p.name}: open ${p.opening_clock}-${p.closing_clock}` +
        ` (latest start), visit ${p.duration} min, score ${p.score}`));
      points.appendChild(c);
      if (detail.named) {
        const left = x + 14 + 6.5 * p.name.length > SIZE; // no room on the right: go left
        names.appendChild(el("text", { x: (left ? x - 10 : x + 10).toFixed(1),
          y: (y + 4).toFixed(1), class: "name", "text-anchor": left ? "end" : "start" },
        p.name));
      }
    }
    state.start = detail.coords === "latlon" ? { lat: detail.start.lat, lon: detail.start.lon }
      : { x: detail.start.x, y: detail.start.y };
    drawStart();
  }

  function clearPlan() {
    state.answer = null;
    $("route").setAttribute("points", "");
    $("labels").replaceChildren();
    for (const c of document.querySelectorAll("circle.poi")) c.classList.remove("visited");
    $("itinerary").hidden = true;
    $("itinerary").tBodies[0].replaceChildren();
    $("summary").textContent = "";
  }

  async function selectRegion(id) {
    clearPlan();
    setError("");
    state.ready = false;
    state.region = id;
    setStatus(`Loading ${id}...`);
    try {
      const detail = await getJSON(`regions/${encodeURIComponent(id)}`);
      if (state.region !== id) return; // another region was picked meanwhile
      state.detail = detail;
      drawRegion(detail);
      $("t-start").value = detail.t_start_clock;
      $("t-end").value = detail.t_end_clock;
      const pref = $("preference");
      pref.replaceChildren();
      for (const [name, about] of Object.entries(detail.preferences)) {
        const o = document.createElement("option");
        o.value = name; o.textContent = name; o.title = about;
        pref.appendChild(o);
      }
      pref.value = "balanced";
      // a Solomon or Cordeau region counts from the depot's opening, not from midnight
      const day = detail.clock_origin === "opening"
        ? `day 0-${detail.day[1]} min from the depot's opening (HH:MM counts from it: ` +
          `09:00 = 540 min after it opens)`
        : `day ${detail.day_clock[0]}-${detail.day_clock[1]}`;
      setStatus(`${id}: ${detail.points.length} points, ${day}. Click the map to move ` +
        `the start, then press Plan.`);
      $("plan").disabled = false;
      state.ready = true;
    } catch (e) {
      setError(e.message);
      setStatus("");
    }
  }

  function onMapClick(ev) {
    if (!view || state.busy) return;
    const svg = $("map");
    const pt = svg.createSVGPoint();
    pt.x = ev.clientX; pt.y = ev.clientY;
    const p = pt.matrixTransform(svg.getScreenCTM().inverse());
    state.start = view.fromPx(p.x, p.y);
    drawStart();
    clearPlan();
  }

  function drawPlan(ans) {
    const pts = ans.route.map((s) => view.toPx(s).map((v) => v.toFixed(1)).join(","));
    $("route").setAttribute("points", pts.join(" "));
    const labels = $("labels");
    labels.replaceChildren();
    for (const s of ans.route) {
      if (s.kind !== "visit") continue;
      const c = document.querySelector(`circle.poi[data-node="${s.node}"]`);
      if (c) c.classList.add("visited");
      const [x, y] = view.toPx(s);
      labels.appendChild(el("text", { x: x.toFixed(1), y: y.toFixed(1), class: "label" },
        String(s.stop)));
    }
    const body = $("itinerary").tBodies[0];
    body.replaceChildren();
    const row = (cells, cls) => {
      const tr = document.createElement("tr");
      if (cls) tr.className = cls;
      for (const [text, tcls] of cells) {
        const td = document.createElement("td");
        td.textContent = text;
        if (tcls) td.className = tcls;
        tr.appendChild(td);
      }
      body.appendChild(tr);
      return tr;
    };
    ans.route.forEach((s, i) => {
      if (i > 0) {
        const leg = ans.legs[i - 1];
        const wait = s.wait > 0 ? `, wait ${Math.round(s.wait)} min` : "";
        const tr = row([["", ""], [`${leg.depart_clock} \u2192 ${leg.arrive_clock}: ` +
          `${round(leg.travel, 1)} min travel${wait}`, ""]], "leg");
        tr.lastChild.colSpan = 5;
      }
      const tr = row([
        [String(s.stop), ""], [s.name, ""],
        [s.kind === "start" ? "" : s.arrival_clock, "t"],
        [s.kind === "visit" ? s.start_clock : "", "t"],
        [s.kind === "end" ? "" : s.leave_clock, "t"],
        [s.kind === "visit" ? String(s.score) : "", "t"],
      ], "stop");
      tr.dataset.node = s.node;
      tr.dataset.kind = s.kind;
    });
    $("itinerary").hidden = false;
    const version = ans.model_version === null ? "checkpoint" : `model version ${ans.model_version}`;
    $("summary").textContent = `${ans.visits} visit(s), score ${round(ans.score, 2)}, ` +
      `${ans.t_start_clock}-${ans.t_end_clock}; ${ans.method}, ${version}, ` +
      `${Math.round(ans.solve_ms)} ms`;
  }

  async function plan() {
    if (!state.detail || state.busy) return;
    setError("");
    clearPlan();
    const req = {
      region: state.region, start: state.start, t_start: $("t-start").value.trim(),
      t_end: $("t-end").value.trim(), preference: $("preference").value,
      method: $("method").value,
    };
    state.request = req;
    state.busy = true;
    $("plan").disabled = true;
    setStatus("Planning...");
    try {
      const ans = await getJSON("plan", {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify(req),
      });
      if (state.request !== req) return;
      state.answer = ans;
      drawPlan(ans);
      setStatus(`Planned ${req.region}.`);
    } catch (e) {
      setError(e.message);
      setStatus("");
    } finally {
      state.busy = false;
      $("plan").disabled = false;
    }
  }

  async function init() {
    $("map").addEventListener("click", onMapClick);
    $("plan").addEventListener("click", plan);
    $("region").addEventListener("change", (ev) => selectRegion(ev.target.value));
    try {
      state.regions = await getJSON("regions");
    } catch (e) {
      setError(e.message);
      setStatus("");
      return;
    }
    const sel = $("region");
    for (const r of state.regions) {
      const o = document.createElement("option");
      o.value = r.region;
      o.textContent = `${r.region} (${r.group}, ${r.points} points)`;
      sel.appendChild(o);
    }
    if (state.regions.length) await selectRegion(state.regions[0].region);
  }

  init();
})();
