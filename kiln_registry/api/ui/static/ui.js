// /ui: the operator dashboard over the JSON API, refreshed every REFRESH_MS (each
// request says `X-Kiln-Refresh: 1`, so the server logs them at DEBUG and sums them up
// once a minute at INFO).  Times are shown in UTC, as the API gives them.
// Every value from the registry is written with textContent (never as HTML), so
// aliases, notes and error messages cannot inject markup.  The token lives in this
// tab's sessionStorage and is sent only as `Authorization: Bearer`.
"use strict";
(function () {
  const KEY = "kiln-token";
  const REFRESH_MS = 1000;
  const TEACHERS_PAGE = 50;
  const JOBS_PAGE = 50;
  const RECEIPTS_PAGE = 20;
  const CREATE_TOKEN = "kiln tokens create --config kiln.toml --name NAME --scope read";
  const BADGES = new Set(["verified", "configured", "legacy_unverified", "unavailable", "queued",
    "probing", "running", "succeeded", "failed", "cancelled", "passed", "yes", "no"]);

  const $ = (id) => document.getElementById(id);
  const state = $("state");
  const form = $("token-form");
  let selected = null;
  let timer = null;
  let generation = 0;

  class Refused extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  function headers() {
    const token = sessionStorage.getItem(KEY);
    const sent = { "X-Kiln-Refresh": "1" };
    if (token) sent.Authorization = "Bearer " + token;
    return sent;
  }

  async function api(path) {
    const response = await fetch(path, { headers: headers(), credentials: "omit", cache: "no-store" });
    if (!response.ok) {
      let message = "GET " + path + " answered " + response.status;
      try {
        message = (await response.json()).error.message;
      } catch (err) {
        // keep the generic message
      }
      throw new Refused(response.status, message);
    }
    return response.json();
  }

  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  }

  function badge(value) {
    const span = el("span", value, "badge");
    if (BADGES.has(value)) span.classList.add(value);
    return span;
  }

  function row(cells) {
    const tr = document.createElement("tr");
    for (const cell of cells) {
      if (cell instanceof Node) {
        const td = document.createElement("td");
        td.appendChild(cell);
        tr.appendChild(td);
      } else {
        tr.appendChild(cell && cell.td ? cell.td : el("td", cell === null || cell === undefined ? "" : cell));
      }
    }
    return tr;
  }

  function mono(text) {
    return { td: el("td", text === null || text === undefined ? "-" : text, "mono") };
  }

  function fill(tableId, rows, emptyText, columns) {
    const body = $(tableId).tBodies[0];
    if (rows.length === 0) {
      const td = el("td", emptyText, "empty");
      td.colSpan = columns;
      const tr = document.createElement("tr");
      tr.appendChild(td);
      rows = [tr];
    }
    body.replaceChildren(...rows);
  }

  // "2026-12-03T14:08:36.123456Z" -> "2026-12-03 14:08:36" (the column says UTC).
  function utc(stamp) {
    if (!stamp) return null;
    const match = /^(\d{4}-\d\d-\d\d)T(\d\d:\d\d:\d\d)/.exec(stamp);
    return match ? match[1] + " " + match[2] : stamp;
  }

  function short(revision) {
    return revision ? revision.replace(/^sha256:/, "").slice(0, 16) : null;
  }

  function statusCell(entry) {
    const wrap = document.createElement("span");
    wrap.appendChild(badge(entry.status));
    if (entry.status_message) {
      // A local teacher's launch progress, or why the alias is unavailable.
      wrap.appendChild(el("small", entry.status_message, "message"));
    }
    return wrap;
  }

  function teacherRow(entry, last) {
    const alias = entry.spec.alias;
    const button = el("button", alias, "alias");
    button.type = "button";
    button.title = "show the receipts of this teacher";
    button.addEventListener("click", () => {
      selected = alias;
      refresh();
    });
    const tr = row([
      button,
      entry.spec.kind,
      statusCell(entry),
      badge(entry.usable ? "yes" : "no"),
      mono(short(entry.identity_revision)),
      mono(utc(last ? last.created_at : null)),
      last ? badge(last.outcome) : "-",
      entry.spec.notes || "",
    ]);
    tr.dataset.alias = alias;
    // Anywhere on the row selects the teacher; the button keeps it reachable by keyboard.
    tr.title = "show the receipts of this teacher";
    tr.addEventListener("click", (event) => {
      if (event.target === button) return;
      selected = alias;
      refresh();
    });
    if (alias === selected) tr.classList.add("selected");
    return tr;
  }

  async function lastReceipt(alias) {
    try {
      const answer = await api("/v1/teachers/" + encodeURIComponent(alias) + "/receipts?limit=1");
      return answer.receipts[0] || null;
    } catch (err) {
      if (err instanceof Refused && err.status === 404) return null;
      throw err;
    }
  }

  async function teachers() {
    const answer = await api("/v1/teachers?limit=" + TEACHERS_PAGE);
    const lasts = await Promise.all(answer.teachers.map((t) => lastReceipt(t.spec.alias)));
    $("teachers-more").textContent = answer.next_cursor ? "(first " + TEACHERS_PAGE + " shown)" : "";
    fill("teachers", answer.teachers.map((t, i) => teacherRow(t, lasts[i])), "no teachers registered", 8);
  }

  function failureText(report) {
    const failure = report.failure;
    if (!failure) return "";
    return [failure.code, failure.rule, failure.message].filter(Boolean).join(": ");
  }

  async function receipts() {
    $("receipts-alias").textContent = selected === null ? "(choose a teacher)" : "of " + selected;
    if (selected === null) {
      fill("receipts", [], "choose a teacher above", 7);
      return;
    }
    const path = "/v1/teachers/" + encodeURIComponent(selected) + "/receipts?limit=" + RECEIPTS_PAGE;
    const answer = await api(path);
    const rows = answer.receipts.map((r) => row([
      r.id,
      mono(utc(r.created_at)),
      badge(r.outcome),
      mono(short(r.identity_revision)),
      r.report.attempts.map((a) => a.purpose + " K=" + a.k + " " + (a.status_code || "-")).join(", "),
      Math.round(r.report.elapsed_ms) + " ms",
      { td: el("td", failureText(r.report), "error") },
    ]));
    fill("receipts", rows, "no receipts", 7);
  }

  function progressCell(progress) {
    const wrap = document.createElement("span");
    const bar = document.createElement("progress");
    bar.max = Math.max(progress.total, 1);
    bar.value = progress.done;
    wrap.appendChild(bar);
    wrap.appendChild(el("span", " " + progress.done + " / " + progress.total, "done"));
    return wrap;
  }

  function jobStatusCell(job) {
    const wrap = document.createElement("span");
    wrap.appendChild(badge(job.status));
    // A queued job no live worker will claim says so (and what to start).
    if (job.waiting) wrap.appendChild(el("small", job.waiting, "message waiting"));
    return wrap;
  }

  function jobRow(job) {
    const error = job.error ? [job.error.code, job.error.message].filter(Boolean).join(": ") : "";
    const kind = job.kind === "off_policy_generation" ? "generation" : "scoring";
    const tr = row([
      mono(job.id),
      job.teacher,
      kind,
      job.top_k,
      jobStatusCell(job),
      progressCell(job.progress),
      job.progress.scored,
      job.progress.cache_hits,
      job.progress.requests + " (" + job.progress.retries + ")",
      { td: el("td", error, "error") },
      mono(utc(job.timestamps.updated_at)),
    ]);
    tr.dataset.job = job.id;
    tr.dataset.status = job.status;
    return tr;
  }

  async function jobs() {
    const answer = await api("/v1/jobs?limit=" + JOBS_PAGE);
    fill("jobs", answer.jobs.map(jobRow), "no jobs", 11);
  }

  // The header: the registry's version and its job workers (GET /ready).
  async function header() {
    const ready = await api("/ready");
    $("version").textContent = "v" + ready.version;
    const workers = $("workers");
    const live = ready.workers.live;
    workers.classList.toggle("none", live === 0);
    if (live === 0) {
      workers.textContent = "no live job worker" +
        (ready.workers.queued ? " (" + ready.workers.queued + " queued): start `kiln worker`" : "");
    } else {
      workers.textContent = live + (live === 1 ? " job worker" : " job workers") + " live";
    }
  }

  // The token prompt, as a sentence; `lead` says what happened first, if anything.
  function tokenReason(lead) {
    const code = el("code", CREATE_TOKEN);
    return [
      (lead ? lead + " " : "") + "This registry needs an API token with the read scope." +
        " Create one with ",
      code,
      " on the registry's host, then paste it below.",
    ];
  }

  function askForToken(lead) {
    stop();
    $("board").hidden = true;
    $("forget").hidden = true;
    $("token-reason").replaceChildren(...tokenReason(lead));
    form.hidden = false;
    state.textContent = "";
    $("token-input").focus();
  }

  function stop() {
    if (timer !== null) clearTimeout(timer);
    timer = null;
  }

  async function refresh() {
    stop();
    const mine = ++generation;
    try {
      await Promise.all([header(), teachers(), receipts(), jobs()]);
      $("board").hidden = false;
      form.hidden = true;
      $("forget").hidden = !sessionStorage.getItem(KEY);
      state.textContent = "updated " + new Date().toISOString().slice(11, 19) + " UTC";
    } catch (err) {
      if (err instanceof Refused && (err.status === 401 || err.status === 403)) {
        const had = sessionStorage.getItem(KEY);
        askForToken(had ? "The registry refused this token (" + err.message + ")." : "");
        return;
      }
      state.textContent = "refresh failed: " + err.message;
    }
    // A newer refresh may run already; a hidden tab stops polling until it is shown again.
    if (mine === generation && !document.hidden) timer = setTimeout(refresh, REFRESH_MS);
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY, $("token-input").value.trim());
    $("token-input").value = "";
    refresh();
  });
  $("forget").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    askForToken("Token forgotten.");
  });
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && timer === null && form.hidden) refresh();
  });
  refresh();
})();
