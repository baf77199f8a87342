// The guard's page: four tabs over the JSON API of tracker/web/server.py. No framework, no build.
"use strict";

let csrf = null;          // this session's token, sent with every change (X-CSRF-Token)
let passwordRequired = true;  // as /api/session says: without a password a lost session is made anew
let eventsNext = null;    // cursor of the next (older) page of events ("<inode>:<mark>:<offset>"), or null
let eventsLoad = 0;       // the latest load of the event list: an answer to an older one is dropped
let statsTimer = null;
let liveRetry = null;     // the next try at a live view that was refused or broke off
const LIVE_RETRY_S = 5;
// Said while /api/state gets no answer at all (fetch's TypeError): the guard is stopped or restarting.
const NOT_ANSWERING = "The guard is not answering: it is stopped or restarting. The numbers come back when it answers.";
// Said by every other request that gets no answer at all (the browser's own words were "Failed to fetch").
const NO_ANSWER = "The guard is not answering: it is stopped or restarting; try again once it is back.";
const LIVE_UNAVAILABLE = "The live view is not available (too many viewers, or the guard is not answering); " +
  `trying again every ${LIVE_RETRY_S} s.`;

const $ = (id) => document.getElementById(id);

async function api(path, options = {}) {
  const headers = Object.assign({}, options.headers || {});
  if (options.method && options.method !== "GET") headers["X-CSRF-Token"] = csrf || "";
  let response;
  try {
    response = await fetch(path, Object.assign({}, options, { headers, credentials: "same-origin" }));
  } catch (failure) {  // no answer at all (a TypeError): the guard is stopped or restarting
    const error = new Error(NO_ANSWER);
    error.notAnswering = true;
    throw error;
  }
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (response.status === 401 && path !== "/api/login") sessionLost();
  if (!response.ok) {
    const error = new Error((body && body.error) || `${response.status} ${response.statusText}`);
    error.status = response.status;
    error.body = body;
    throw error;
  }
  return body;
}

function element(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (key === "text") node.textContent = value; else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

// A message of the guard's (written for a terminal) as page content: its `commands` as code, not
// with their backticks.
function prose(text) {
  return text.split("`").map((part, i) => (i % 2 ? element("code", { text: part }) : part));
}

// ---- session -------------------------------------------------------------------------------

async function start(tab = "live") {
  const session = await api("/api/session");
  passwordRequired = session.password_required;
  if (session.logged_in) {
    csrf = session.csrf;
    $("logout").hidden = !session.password_required;
    showTabs(tab);
  } else {
    showLogin();
  }
}

function sessionLost() {
  // With a password, log in again; without one (the page answers this machine only), opening the
  // page makes a session: do that rather than show a form no password can pass, and open again the
  // tab whose request found the session gone (not the Live tab the page opens on).
  const tab = document.querySelector("#tabs button.active");
  if (passwordRequired) showLogin();
  else start(tab ? tab.dataset.tab : "live").catch((error) => { $("login-error").textContent = error.message; });
}

function showLogin() {
  stopLive();
  document.querySelectorAll(".tab").forEach((tab) => { tab.hidden = true; });
  $("tabs").hidden = true;
  $("logout").hidden = true;
  $("login").hidden = false;
  $("password").focus();
}

async function login(event) {
  event.preventDefault();
  $("login-error").textContent = "";
  try {
    const answer = await api("/api/login", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ password: $("password").value }),
    });
    csrf = answer.csrf;
    $("password").value = "";
    $("login").hidden = true;
    $("logout").hidden = false;
    showTabs();
  } catch (error) {
    $("login-error").textContent = error.message;
  }
}

async function logout() {
  try { await api("/api/logout", { method: "POST" }); } catch (e) { /* the session is gone either way */ }
  csrf = null;
  showLogin();
}

// ---- tabs ----------------------------------------------------------------------------------

function showTabs(tab = "live") {
  $("tabs").hidden = false;
  openTab(tab);
}

function openTab(name) {
  document.querySelectorAll("#tabs button").forEach((b) => b.classList.toggle("active", b.dataset.tab === name));
  document.querySelectorAll(".tab").forEach((tab) => { tab.hidden = tab.id !== name; });
  if (name === "live") startLive(); else stopLive();   // frames are encoded only while someone watches
  if (name === "events") {
    loadFilter().then(() => loadEvents(true), (error) => { $("events-error").textContent = error.message; });
  }
  if (name === "people") loadPeople();
  if (name === "speed") loadSpeed();
}

// ---- live ----------------------------------------------------------------------------------

function startLive() {
  stopLive();  // opened again while open: one stream and one poll, not two
  $("live-error").textContent = "";
  openStream();
  loadStats();
  statsTimer = setInterval(loadStats, 1000);
}

function openStream() {
  liveRetry = null;
  $("live-view").src = `/live.mjpg?t=${Date.now()}`;
}

function streamFailed() {  // the stream was refused (503: web.max_viewers watch already) or broke off
  if (!$("live-view").getAttribute("src") || liveRetry !== null) return;  // closed by stopLive, or a try is due
  if ($("live-error").textContent !== NOT_ANSWERING) $("live-error").textContent = LIVE_UNAVAILABLE;
  liveRetry = setTimeout(openStream, LIVE_RETRY_S * 1000);
}

function streamShown() {
  if ($("live-error").textContent === LIVE_UNAVAILABLE) $("live-error").textContent = "";
}

function stopLive() {
  $("live-view").removeAttribute("src");   // closes the stream: the server stops encoding for us
  if (statsTimer !== null) clearInterval(statsTimer);
  if (liveRetry !== null) clearTimeout(liveRetry);
  statsTimer = liveRetry = null;
}

async function loadStats() {
  try {
    const { state } = await api("/api/state");
    if ($("live-error").textContent === NOT_ANSWERING) $("live-error").textContent = "";
    $("fps").textContent = state.fps === undefined ? "-" : state.fps.toFixed(1);
    $("tracks").textContent = state.tracks === undefined ? "-" : state.tracks;
    $("backend").textContent = state.backend ? `${state.backend} (${state.precision})` : "-";
    const rows = Object.entries(state.latency_ms || {}).map(([stage, p]) =>
      element("tr", {}, element("td", { text: stage.replace(/_ms$/, "") }),
        element("td", { text: p.p50.toFixed(1) }), element("td", { text: p.p95.toFixed(1) })));
    $("latency").tBodies[0].replaceChildren(...rows);
  } catch (error) {
    // No numbers rather than the last ones, which would read as live.
    for (const id of ["fps", "tracks", "backend"]) $(id).textContent = "-";
    $("latency").tBodies[0].replaceChildren();
    $("live-error").textContent = error.notAnswering ? NOT_ANSWERING : error.message;
  }
}

// ---- events --------------------------------------------------------------------------------

async function loadFilter() {
  const { people } = await api("/api/people");
  const filter = $("event-filter");
  const chosen = filter.value;
  const options = [element("option", { value: "", text: "everyone" }), element("option", { value: "unknown", text: "unknown" })];
  for (const person of people) options.push(element("option", { value: person.name, text: person.name }));
  filter.replaceChildren(...options);
  filter.value = chosen;
}

async function loadEvents(fresh) {
  // The list is replaced (or extended) only once its page has arrived, and only by the latest load:
  // reopening the tab, changing the filter or clicking "Older events" while a load is on its way must
  // neither list events twice nor mix two filters' events.
  const load = ++eventsLoad;
  $("events-error").textContent = "";
  const query = new URLSearchParams({ limit: "20" });
  if ($("event-filter").value) query.set("identity", $("event-filter").value);
  if (!fresh && eventsNext !== null) query.set("before", eventsNext);
  if (fresh) {  // the old list's cursor belongs to the old filter: no older page of it from now on
    eventsNext = null;
    $("events-more").hidden = true;
  }
  $("events-more").disabled = true;
  try {
    const page = await api(`/api/events?${query}`);
    if (load !== eventsLoad) return;
    const items = page.events.map(eventItem);
    if (fresh) $("event-list").replaceChildren(...items); else $("event-list").append(...items);
    eventsNext = page.next;
    $("events-more").hidden = page.next === null;
  } catch (error) {
    if (load === eventsLoad) $("events-error").textContent = error.message;
  } finally {
    if (load === eventsLoad) $("events-more").disabled = false;
  }
}

function eventItem(event) {
  const when = new Date(event.ts).toLocaleString() +
    (event.media_time_s === null ? "" : ` (${formatMedia(event.media_time_s)} into the video)`);
  const picture = event.snapshot ? element("img", { src: event.snapshot, alt: `snapshot of track ${event.track_id}` })
                                 : element("span", { class: "no-snapshot", text: "no snapshot" });
  const text = element("div", {},
    element("strong", { class: `kind-${event.kind}`, text: event.kind }),
    ` track ${event.track_id}: ${event.identity}` +
      (event.identity === "unknown" ? "" : ` (${event.confidence.toFixed(2)})`),
    element("br"), element("small", { text: when }));
  const item = element("li", { class: "event", "data-id": event.id }, picture, text);
  if (event.snapshot) {
    // The enrol form's rule for a name, checked here too: an empty name was posted as /api/people//from-event.
    const name = element("input", { placeholder: "name", "aria-label": "who this was", class: "this-was-name",
                                    required: "", pattern: $("enrol-name").getAttribute("pattern") });
    const button = element("button", { type: "submit", class: "this-was", text: "This was..." });
    const message = element("small", { class: "this-was-message" });
    const form = element("form", { class: "this-was-form", novalidate: "" }, name, button, message);
    form.addEventListener("submit", async (submitted) => {  // the button, or Enter in the name
      submitted.preventDefault();
      message.textContent = "";
      if (!name.checkValidity()) {
        message.textContent = name.value === "" ? "type who this was first" :
          `bad name "${name.value}"; expected a letter or digit, then up to 63 ASCII letters, digits, _ . or -`;
        return;
      }
      button.disabled = true;  // while the guard adds the face; after it has, for good (the server refuses it again too)
      try {
        const answer = await api(`/api/people/${encodeURIComponent(name.value)}/from-event`, {
          method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ event_id: event.id }),
        });
        message.textContent = [...answer.messages, `added to ${answer.name}`].join("; ");  // (a face kept before dropped)
      } catch (error) {
        message.textContent = error.message;
        button.disabled = false;
      }
    });
    item.append(form);
  }
  return item;
}

function formatMedia(seconds) {
  const whole = Math.floor(seconds);
  return `${Math.floor(whole / 60)}:${String(whole % 60).padStart(2, "0")}`;
}

// ---- people --------------------------------------------------------------------------------

async function loadPeople() {
  $("people-error").textContent = "";
  try {
    const { people } = await api("/api/people");
    $("people-list").replaceChildren(...people.map(personItem));
  } catch (error) {
    $("people-error").textContent = error.message;
  }
}

function personItem(person) {
  const remove = element("button", { class: "forget", text: "Delete" });
  remove.addEventListener("click", async () => {
    if (!window.confirm(`Forget ${person.name}?`)) return;
    remove.disabled = true;
    try {
      await api(`/api/people/${encodeURIComponent(person.name)}`, { method: "DELETE" });
      loadPeople();
    } catch (error) {
      remove.disabled = false;
      if (error.status === 404) await loadPeople();  // deleted already (by another page): list who is left
      $("people-error").textContent = error.message;
    }
  });
  return element("li", { class: "person", "data-name": person.name },
    element("img", { src: `${person.face}?t=${Date.now()}`, alt: `${person.name}'s face` }),
    element("span", { class: "name", text: person.name }), remove);
}

async function enrol(event) {
  event.preventDefault();
  const messages = $("enrol-messages");
  messages.replaceChildren();
  $("people-error").textContent = "";
  const form = new FormData();
  form.append("name", $("enrol-name").value);
  for (const file of $("enrol-photos").files) form.append("photos", file, file.name);
  $("enrol-button").disabled = true;
  try {
    const answer = await api("/api/people", { method: "POST", body: form });
    for (const line of answer.messages) messages.append(element("li", { text: line }));
    messages.append(element("li", { text: `enrolled ${answer.name} from ${answer.used} photo(s), ${answer.skipped} skipped` }));
    $("enrol-form").reset();
    loadPeople();
  } catch (error) {
    for (const line of (error.body && error.body.messages) || []) messages.append(element("li", { text: line }));
    $("people-error").textContent = error.message;
  } finally {
    $("enrol-button").disabled = false;
  }
}

// ---- speed ---------------------------------------------------------------------------------

async function loadSpeed() {
  try {
    showSpeed(await api("/api/speed"));
  } catch (error) {
    $("speed-why").textContent = error.message;
  }
}

function showSpeed(summary) {
  const run = summary.benchmark;
  $("speed-why").textContent = summary.why || (run ? `${run.machine.cpu}, ${run.machine.cores} cores, ${run.machine.arch}` +
    (run.complete ? "" : " (interrupted run)") : "");
  const tables = [];
  if (run) {
    for (const [key, title] of [["mean", "mean ms per image"], ["median", "median ms per image"]]) {
      const head = element("tr", {}, element("th", { text: "batch" }), ...run.columns.map((c) => element("th", { text: c })));
      const body = run.batches.map((batch) => element("tr", {}, element("td", { text: String(batch) }),
        ...run.columns.map((c) => {
          const ms = (run[key][c] || {})[String(batch)];
          return element("td", { text: ms === undefined ? "-" : ms.toFixed(3) });
        })));
      // A run of every backend is a dozen columns: the table scrolls within the page's width, and
      // the page (its header and tabs) stays as wide as the screen.
      tables.push(element("h3", { text: title }), element("div", { class: "table-scroll" },
        element("table", { class: `speed-${key}` }, element("thead", {}, head), element("tbody", {}, ...body))));
    }
    $("speed-plots").replaceChildren(...Object.entries(run.plots).map(([scale, url]) =>
      element("img", { src: url, alt: `per-image time, ${scale} scale` })));
  } else {
    $("speed-plots").replaceChildren();
  }
  $("speed-tables").replaceChildren(...tables);
  $("auto-why").replaceChildren(...prose(summary.auto.why || ""));
  $("auto-picks").hidden = summary.auto.picks.length === 0;   // no profile: the line above says why
  $("auto-picks").tBodies[0].replaceChildren(...summary.auto.picks.map((p) => element("tr", {},
    element("td", { text: String(p.batch) }), element("td", { text: p.backend }), element("td", { text: p.precision }))));
}

// ---- wiring --------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("#tabs button").forEach((b) => b.addEventListener("click", () => openTab(b.dataset.tab)));
  $("login-form").addEventListener("submit", login);
  $("logout").addEventListener("click", logout);
  $("enrol-form").addEventListener("submit", enrol);
  $("event-filter").addEventListener("change", () => loadEvents(true));
  $("events-more").addEventListener("click", () => loadEvents(false));
  $("live-view").addEventListener("error", streamFailed);
  $("live-view").addEventListener("load", streamShown);
  start().catch((error) => { $("login-error").textContent = error.message; });
});
