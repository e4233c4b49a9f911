"""The sandbox page's one HTML document: layout, style and a small script, no build step.

The server draws every message, modal and App Home (see :mod:`bot.sandbox.render`); the
script only fetches those fragments for the chosen user, swaps them in when the event
stream says something changed, and turns clicks and form submissions into POSTs. Each
of its requests carries the token the server wrote into the page (see
:mod:`bot.sandbox.guard`), which is why the event stream is read with ``fetch`` (an
``EventSource`` cannot send a header).

Each load of the page is its own client, with a random id sent on every request: a modal
belongs to the page that opened it, as in Slack (a reload or a second browser does not get
it). Emoji are drawn with the color emoji fonts the machine has; one that no font there can
draw is shown as its meaning in words (drawn beside it by the server), never as an empty
box: the script draws each emoji once on a canvas and compares it with a character no font
has.
"""

from __future__ import annotations

from approvald.bot.sandbox.guard import TOKEN_HEADER

_TOKEN_SLOT = "@@TOKEN@@"


def page_html(token: str) -> str:
    """The page, carrying ``token`` (URL-safe characters only, as the server makes it)."""
    if not token or not token.isascii() or not all(c.isalnum() or c in "-_" for c in token):
        raise ValueError("the page token must be URL-safe text")
    return PAGE.replace(_TOKEN_SLOT, token)


PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="approvald-sandbox" content="@@TOKEN@@">
<title>approvald sandbox</title>
<style>
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.46 -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
       color: #1d1c1d; background: #fff; }
#app { display: grid; grid-template-columns: 260px 1fr auto; height: 100vh; overflow: hidden; }
#app > * { min-height: 0; }
aside { background: #3f0e40; color: #f3eef3; padding: 14px; overflow-y: auto; }
aside .team { font-weight: 800; font-size: 18px; margin-bottom: 12px; }
aside label { display: block; font-size: 13px; margin: 10px 0 4px; color: #d9cfd9; }
aside select, aside input { width: 100%; padding: 5px; border-radius: 4px; border: 1px solid #9a7a9b;
                            font-size: 14px; }
#role { font-size: 12px; color: #cdbccd; margin-top: 4px; }
nav a { display: block; color: #f3eef3; padding: 4px 8px; border-radius: 4px; text-decoration: none; }
nav a.on { background: #1164a3; }
nav h4, aside h4 { margin: 16px 0 6px; font-size: 13px; text-transform: uppercase; color: #cdbccd; }
#start button { margin-top: 8px; width: 100%; }
#start-result { font-size: 12px; margin-top: 6px; word-break: break-all; }
main { display: flex; flex-direction: column; min-width: 0; border-right: 1px solid #ddd;
       overflow: hidden; }
.text, .field, .ctx { overflow-wrap: anywhere; }
main > header { padding: 12px 18px; border-bottom: 1px solid #ddd; font-weight: 800; font-size: 18px; }
#pane { flex: 1; overflow-y: auto; padding: 8px 0; }
#composer { padding: 10px 18px; border-top: 1px solid #ddd; }
#composer input { width: 100%; padding: 8px; border: 1px solid #aaa; border-radius: 6px; }
#thread { width: 480px; display: flex; flex-direction: column; overflow: hidden; }
#thread[hidden] { display: none; }
#thread header { padding: 12px 18px; border-bottom: 1px solid #ddd; font-weight: 800; display: flex;
                 justify-content: space-between; }
#thread-body { flex: 1; overflow-y: auto; padding: 8px 0; }
.msg { padding: 8px 18px; border-left: 3px solid transparent; }
.msg:hover { background: #f8f8f8; }
.msg.ephemeral { background: #f4f0f7; border-left-color: #9b59b6; }
.who { font-size: 15px; }
.time, .edited, .only-you { color: #616061; font-size: 12px; }
.only-you { font-style: italic; }
.b { margin: 4px 0; }
.b-header h3 { margin: 6px 0; font-size: 17px; }
.b-context { color: #616061; font-size: 13px; display: flex; flex-wrap: wrap; gap: 4px 14px; }
.fields { display: grid; grid-template-columns: 1fr 1fr; gap: 6px 16px; }
.b-actions { display: flex; gap: 8px; flex-wrap: wrap; margin-top: 8px; }
hr { border: none; border-top: 1px solid #ddd; }
pre { background: #f6f6f6; border: 1px solid #e0e0e0; border-radius: 4px; padding: 8px;
      white-space: pre-wrap; word-break: break-word; font-size: 13px; margin: 4px 0; }
code { background: #f6f6f6; border: 1px solid #e0e0e0; border-radius: 3px; padding: 0 3px;
       color: #c01343; font-size: 13px; }
pre code { border: none; color: inherit; }
.mention { background: #e8f5fa; color: #1264a3; border-radius: 3px; padding: 0 2px; }
.mention.broadcast { background: #fff3c4; color: #6b5200; }
.btn { font: inherit; font-size: 14px; font-weight: 700; padding: 4px 14px; border-radius: 4px;
       border: 1px solid #bbb; background: #fff; cursor: pointer; }
.btn:hover { background: #f3f3f3; }
.btn.primary { background: #007a5a; color: #fff; border-color: #007a5a; }
.btn.danger { background: #e01e5a; color: #fff; border-color: #e01e5a; }
.btn[disabled] { opacity: .5; }
a.replies { display: inline-block; margin-top: 4px; font-size: 13px; font-weight: 700; color: #1264a3; }
.empty { color: #888; padding: 12px 18px; }
.b-unknown { color: #a00; font-style: italic; }
.emoji { font-family: "Noto Color Emoji", "Apple Color Emoji", "Segoe UI Emoji", "Twemoji Mozilla",
         "EmojiOne Color", sans-serif; font-style: normal; }
.emoji-text .emoji { font-size: 0; }
.emoji-text .emoji::after {
  content: "[" attr(data-text) "]"; font: 12px/1.4 -apple-system, "Segoe UI", Roboto, Helvetica,
  Arial, sans-serif; color: #616061; }
dialog.confirm { border: none; border-radius: 8px; box-shadow: 0 10px 40px rgba(0,0,0,.35);
                 max-width: 440px; padding: 18px 22px; }
dialog.confirm .buttons { display: flex; justify-content: flex-end; gap: 8px; margin-top: 14px; }
#modal-layer { position: fixed; inset: 0; background: rgba(0,0,0,.45); display: flex;
               align-items: center; justify-content: center; }
#modal-layer[hidden] { display: none; }
form.modal { background: #fff; border-radius: 8px; width: 560px; max-height: 90vh; display: flex;
             flex-direction: column; box-shadow: 0 18px 50px rgba(0,0,0,.4); }
form.modal header { padding: 14px 20px; border-bottom: 1px solid #ddd; }
form.modal header h2 { margin: 0; font-size: 20px; }
.modal-body { padding: 10px 20px; overflow-y: auto; }
form.modal footer { padding: 12px 20px; border-top: 1px solid #ddd; display: flex;
                    justify-content: flex-end; gap: 8px; }
.b-input .label { display: block; font-weight: 700; margin: 8px 0 4px; }
.b-input textarea, .b-input input { width: 100%; font: 14px/1.4 Menlo, Consolas, monospace;
                                    padding: 8px; border: 1px solid #888; border-radius: 4px; }
.input-error { color: #e01e5a; font-size: 13px; margin-top: 4px; white-space: pre-wrap; }
.hint { color: #616061; font-size: 13px; margin-top: 4px; }
.optional { font-weight: 400; color: #616061; }
.home-tab { padding: 0 18px; }
section.dm { border-top: 1px solid #eee; }
main h4 { margin: 14px 18px 4px; }
#toast { position: fixed; bottom: 18px; left: 50%; transform: translateX(-50%); background: #1d1c1d;
         color: #fff; padding: 8px 16px; border-radius: 6px; font-size: 14px; }
#toast:empty { display: none; }
.checkboxes, .radios { display: flex; flex-direction: column; gap: 4px; margin: 4px 0; }
label.check { display: flex; gap: 6px; align-items: baseline; font-weight: 400; }
label.check input { width: auto; flex: none; }
select.b-select { width: 100%; padding: 6px; font-size: 14px; border: 1px solid #888;
                  border-radius: 4px; background: #fff; }
.b-section .accessory { margin-top: 4px; }
/* a phone's width: the sidebar becomes a header, the channel takes the width, and a thread
   or a modal covers the screen (as Slack's app shows them) */
@media (max-width: 720px) {
  #app { display: block; height: auto; overflow: visible; }
  aside { padding: 10px 12px; }
  aside .team { font-size: 16px; margin-bottom: 4px; }
  nav { display: flex; flex-wrap: wrap; gap: 2px 6px; }
  nav h4 { width: 100%; margin: 8px 0 2px; }
  nav a { padding: 2px 6px; }
  #start { margin-top: 8px; }
  main { display: block; border-right: none; min-height: 60vh; }
  #pane { overflow: visible; }
  .msg { padding: 8px 10px; }
  .fields { grid-template-columns: 1fr; }
  #thread { position: fixed; inset: 0; width: auto; background: #fff; z-index: 5; }
  form.modal { width: calc(100vw - 16px); max-height: 96vh; }
  .modal-body { padding: 8px 12px; }
  dialog.confirm { max-width: calc(100vw - 24px); }
}
</style>
</head>
<body data-version="-1">
<div id="app">
<aside>
  <div class="team">approvald sandbox</div>
  <label for="user">Acting as</label>
  <select id="user"></select>
  <div id="role"></div>
  <nav id="nav"></nav>
  <form id="start" autocomplete="off">
    <h4>Start a demo run</h4>
    <label for="agent">Agent</label>
    <select id="agent" name="agent">
      <option value="demo-refund">demo-refund</option>
      <option value="demo-steps">demo-steps</option>
    </select>
    <div class="refund-only">
      <label for="order">Order</label><input id="order" name="order" value="A-1">
      <label for="amount">Amount in $ (empty: the duplicate charge)</label>
      <input id="amount" name="amount" placeholder="e.g. 25.00">
    </div>
    <div class="steps-only" hidden>
      <label for="ticks">Ticks</label><input id="ticks" name="ticks" value="3">
    </div>
    <button class="btn primary" type="submit">Start run</button>
    <div id="start-result"></div>
  </form>
</aside>
<main>
  <header id="title">#approvals</header>
  <div id="pane"></div>
  <form id="composer" autocomplete="off">
    <input id="command" placeholder="Type /approvals to list what you may decide">
  </form>
</main>
<section id="thread" hidden>
  <header><span>Thread</span><button type="button" class="btn" id="close-thread">Close</button></header>
  <div id="thread-body"></div>
</section>
</div>
<div id="modal-layer" hidden></div>
<div id="toast"></div>
<script>
"use strict";
const $ = (s) => document.querySelector(s);
// this start's token: every request to /ui/ carries it (another site's page has none)
const TOKEN = document.querySelector('meta[name="approvald-sandbox"]').content;
const H = {"@@HEADER@@": TOKEN};
const params = new URLSearchParams(location.search);
// this page's own id: a modal it opens is shown here only (a new page load is a new client)
const CLIENT = Array.from(crypto.getRandomValues(new Uint8Array(12)),
                          (b) => b.toString(16).padStart(2, "0")).join("");
const S = {user: params.get("user") || localStorage.getItem("approvald.user") || "U_DANA",
           pane: params.get("pane") || "C_APPROVALS", thread: "", modalKey: null, people: [],
           follow: ""};

function toast(text) {
  $("#toast").textContent = text;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { $("#toast").textContent = ""; }, 6000);
}

async function post(path, body) {
  const r = await fetch(path, {method: "POST", headers: {"Content-Type": "application/json", ...H},
                               body: JSON.stringify({...body, client: CLIENT})});
  let d = {};
  try { d = await r.json(); } catch (e) { d = {ok: false, error: "HTTP " + r.status}; }
  if (!d.ok) toast(d.error || ("HTTP " + r.status));
  return d;
}

function drawNav(channels) {
  const nav = $("#nav");
  const items = [{id: "home", label: "Home (approvald app)"}].concat(
    channels.map((c) => ({id: c.id, label: "# " + c.name})));
  nav.innerHTML = "<h4>Channels</h4>";
  for (const item of items) {
    const a = document.createElement("a");
    a.href = "#"; a.textContent = item.label; a.dataset.pane = item.id;
    if (item.id === S.pane) a.className = "on";
    nav.appendChild(a);
  }
  // beyond Slack: the mails approvald sent this person, and the web review queue
  nav.insertAdjacentHTML("beforeend", "<h4>Without Slack</h4>");
  const mail = document.createElement("a");
  mail.href = "#"; mail.textContent = "Mail"; mail.dataset.pane = "mail"; mail.id = "nav-mail";
  if (S.pane === "mail") mail.className = "on";
  nav.appendChild(mail);
  const review = document.createElement("a");
  review.href = "/review"; review.target = "_blank"; review.rel = "noopener";
  review.id = "nav-review"; review.textContent = "Review queue \u2197";
  nav.appendChild(review);
}

function drawPeople(people) {
  const select = $("#user");
  if (select.options.length !== people.length) {
    select.innerHTML = "";
    for (const p of people) {
      const o = document.createElement("option");
      o.value = p.id; o.textContent = p.name + " (" + p.id + ")";
      select.appendChild(o);
    }
  }
  select.value = S.user;
  const me = people.find((p) => p.id === S.user);
  $("#role").textContent = me ? me.role : "";
}

// Redraw ``container`` as ``html``, replacing only the messages that changed (keyed by
// their ts): a card being clicked is not swapped out because its thread moved on.
function morph(container, html) {
  const t = document.createElement("template");
  t.innerHTML = html;
  const fresh = Array.from(t.content.children), old = Array.from(container.children);
  const key = (el) => el.dataset.ts || "";
  const same = fresh.length >= old.length && old.every((el, i) => key(el) && key(el) === key(fresh[i]));
  if (!same) { container.replaceChildren(...fresh); return; }
  old.forEach((el, i) => { if (el.outerHTML !== fresh[i].outerHTML) el.replaceWith(fresh[i]); });
  for (const el of fresh.slice(old.length)) container.appendChild(el);
}

const dialogOpen = () => document.querySelector("#pane dialog[open], #thread-body dialog[open]");

async function refresh() {
  const asked = S.user;
  const q = new URLSearchParams({user: asked, pane: S.pane, thread: S.thread, client: CLIENT});
  const r = await fetch("/ui/state?" + q, {headers: H});
  const d = await r.json();
  if (!d.ok) { toast(d.error); return; }
  // a confirm dialog opened while this was on its way: draw once it is closed
  if (dialogOpen()) { deferred = true; return; }
  drawPeople(d.people);
  drawNav(d.channels);
  $("#title").textContent = d.title;
  const pane = $("#pane"), threadBody = $("#thread-body");
  const stick = (el) => el.scrollHeight - el.scrollTop - el.clientHeight < 80;
  // only what changed is redrawn: a button being pressed is not swapped under the pointer
  if (S.drawnMain !== d.main) {
    const atEnd = stick(pane), was = pane.scrollTop;
    morph(pane, d.main);
    S.drawnMain = d.main;
    pane.scrollTop = atEnd ? pane.scrollHeight : was;
  }
  pane.dataset.channel = S.pane === "home" ? "" : S.pane;
  // a run started from this page: its thread opens beside its card once it is posted
  if (S.follow) {
    const parent = pane.querySelector(`.msg[data-run="${CSS.escape(S.follow)}"]`);
    if (parent) { S.follow = ""; S.thread = parent.dataset.ts; schedule(); }
  }
  $("#composer").hidden = S.pane === "home" || S.pane === "mail";
  $("#thread").hidden = !(S.thread && d.thread);
  if (S.drawnThread !== d.thread) {
    const atEnd = stick(threadBody), was = threadBody.scrollTop;
    morph(threadBody, d.thread);
    S.drawnThread = d.thread;
    threadBody.scrollTop = atEnd ? threadBody.scrollHeight : was;
  }
  threadBody.dataset.channel = S.pane;
  if (d.modal_key !== S.modalKey) {
    S.modalKey = d.modal_key;
    $("#modal-layer").innerHTML = d.modal;
    $("#modal-layer").hidden = !d.modal;
    const first = $("#modal-layer textarea, #modal-layer input");
    if (first) first.focus();
  }
  emojiAsText();
  document.body.dataset.version = d.version;
  document.body.dataset.ready = d.ready ? "1" : "0";
  document.body.dataset.user = asked;  // drawn for this user (tests wait for it)
}

// An emoji no font here can draw would be an empty box: show its meaning instead. Each is
// drawn once on a canvas and compared with a character no font has (?emoji=text: always).
const drawable = new Map();
function canDraw(char) {
  if (!drawable.has(char)) {
    const c = document.createElement("canvas");
    c.width = c.height = 32;
    const g = c.getContext("2d", {willReadFrequently: true});
    const ink = (s) => {
      g.clearRect(0, 0, 32, 32);
      g.font = "24px " + getComputedStyle(document.querySelector(".emoji") || document.body).fontFamily;
      g.textBaseline = "top";
      g.fillText(s, 0, 0);
      return g.getImageData(0, 0, 32, 32).data;
    };
    const a = ink(char), none = ink("\\u{10FFFD}");
    let drawn = false, differs = false;
    for (let i = 3; i < a.length; i += 4) { if (a[i]) drawn = true; if (a[i] !== none[i]) differs = true; }
    drawable.set(char, drawn && differs);
  }
  return drawable.get(char);
}
// a rule per emoji name, not a class on the elements: the page redraws only what changed
// (see morph), and a class added here would make every message look changed
const asText = document.createElement("style");
document.head.appendChild(asText);
const judged = new Set();
function emojiAsText() {
  if (params.get("emoji") === "text") { document.documentElement.classList.add("emoji-text"); return; }
  for (const el of document.querySelectorAll(".emoji[data-name]")) {
    const name = el.dataset.name;
    if (judged.has(name)) continue;
    judged.add(name);
    if (!canDraw(el.textContent)) {
      const sel = '.emoji[data-name="' + CSS.escape(name) + '"]';
      asText.textContent += sel + " { font-size: 0; } " + sel + '::after { content: "[" attr(data-text) "]"; '
        + "font: 12px/1.4 sans-serif; color: #616061; }\\n";
    }
  }
}
new MutationObserver(emojiAsText).observe(document.body, {childList: true, subtree: true});

let busy = false, again = false, deferred = false;
async function schedule() {
  // redrawing would take an open confirm dialog away from under the reader: wait for it
  if (dialogOpen()) { deferred = true; return; }
  if (busy) { again = true; return; }
  busy = true;
  try { await refresh(); } catch (e) { toast(String(e)); }
  finally { busy = false; if (again) { again = false; schedule(); } }
}

// What a surface's inputs hold, as Slack sends it with a button press or a submission:
// {block_id: {action_id: text | option value | [option values]}}
function inputsOf(root) {
  const values = {};
  const put = (el, v) => {
    const block = el.closest("[data-block-id]");
    if (block) (values[block.dataset.blockId] = values[block.dataset.blockId] || {})[el.dataset.actionId] = v;
  };
  for (const el of root.querySelectorAll("textarea[data-action-id], input[type=text][data-action-id]")) put(el, el.value);
  for (const el of root.querySelectorAll("select[data-action-id]")) if (el.value) put(el, el.value);
  for (const el of root.querySelectorAll(".radios[data-action-id]")) {
    const chosen = el.querySelector("input:checked");
    if (chosen) put(el, chosen.value);
  }
  for (const el of root.querySelectorAll(".checkboxes[data-action-id]"))
    put(el, Array.from(el.querySelectorAll("input:checked"), (i) => i.value));
  return values;
}

async function press(button) {
  const body = {user: S.user, action_id: button.dataset.actionId};
  const view = button.closest("[data-view-id]");
  const msg = button.closest(".msg");
  if (msg) {
    body.ts = msg.dataset.ts;
    body.version = msg.dataset.version || "";   // the card as this page drew it
    body.channel = msg.closest("[data-channel]").dataset.channel;
    body.state = inputsOf(msg);
  } else if (view) {
    body.view_id = view.dataset.viewId;
    body.state = inputsOf(view);
  }
  button.disabled = true;
  try { await post("/ui/action", body); } finally { button.disabled = false; afterAct(); }
}

// the App Home is drawn when it is opened: open it again after acting from it
function afterAct() { if (S.pane === "home") openHome(); else schedule(); }

async function openHome() {
  await post("/ui/home", {user: S.user});
  schedule();
}

document.addEventListener("click", async (ev) => {
  const t = ev.target.closest("a, button");
  if (!t) return;
  if (t.dataset.pane) {
    ev.preventDefault(); S.pane = t.dataset.pane; S.thread = "";
    if (S.pane === "home") openHome(); else schedule();
    return;
  }
  if (t.matches("a.replies")) { ev.preventDefault(); S.thread = t.dataset.thread; schedule(); return; }
  if (t.matches("a.permalink")) {
    ev.preventDefault(); S.pane = t.dataset.channel; S.thread = t.dataset.thread;
    schedule(); return;
  }
  if (t.id === "close-thread") { S.thread = ""; schedule(); return; }
  if (t.dataset.confirm) {
    const dialog = t.closest("dialog");
    dialog.close();
    if (t.dataset.confirm === "yes") await press(dialog.parentElement.querySelector("button[data-action-id]"));
    return;
  }
  if (t.dataset.close) {
    const form = t.closest("form.modal");
    await post("/ui/close", {user: S.user, view_id: form.dataset.viewId});
    schedule();
    return;
  }
  if (t.tagName === "BUTTON" && t.dataset.actionId) {
    const wrap = t.closest(".confirmable");
    if (wrap) { wrap.querySelector("dialog").showModal(); return; }
    await press(t);
  }
});

document.addEventListener("submit", async (ev) => {
  const form = ev.target;
  ev.preventDefault();
  if (form.matches("form.modal")) {
    const values = inputsOf(form);
    const submit = form.querySelector("[data-submit]");
    if (submit) submit.disabled = true;
    try { await post("/ui/submit", {user: S.user, view_id: form.dataset.viewId, values}); }
    finally { if (submit) submit.disabled = false; afterAct(); }
  } else if (form.id === "start") {
    const f = new FormData(form);
    const body = {user: S.user, agent: f.get("agent"), order: f.get("order"),
                  amount: f.get("amount"), ticks: f.get("ticks")};
    const d = await post("/ui/runs", body);
    if (d.ok) {
      $("#start-result").textContent = "Started run " + d.run_id.slice(0, 12) + ": " + d.task;
      S.follow = d.run_id;
      if (S.pane === "home" || S.pane === "mail") S.pane = d.channel || S.pane;
      schedule();
    }
  } else if (form.id === "composer") {
    const text = $("#command").value.trim();
    if (!text) return;
    const d = await post("/ui/command", {user: S.user, channel: S.pane, text});
    if (d.ok) $("#command").value = "";
    schedule();
  }
});

$("#user").addEventListener("change", (ev) => {
  S.user = ev.target.value;
  localStorage.setItem("approvald.user", S.user);
  S.modalKey = null;
  if (S.pane === "home") openHome(); else schedule();
});
$("#agent").addEventListener("change", (ev) => {
  const steps = ev.target.value === "demo-steps";
  document.querySelector(".refund-only").hidden = steps;
  document.querySelector(".steps-only").hidden = !steps;
});

document.addEventListener("close", () => {
  if (deferred) { deferred = false; schedule(); }
}, true);

// The event stream, read with fetch so it carries the token; reconnects like EventSource.
// A 403 means the sandbox was restarted (a new token): reload once to get the new page.
async function listen() {
  for (;;) {
    try {
      const r = await fetch("/ui/events", {headers: H, cache: "no-store"});
      if (r.status === 403) {
        const key = "approvald.reloaded." + TOKEN;
        if (!sessionStorage.getItem(key)) { sessionStorage.setItem(key, "1"); location.reload(); return; }
        toast((await r.json()).error);
        return;
      }
      if (r.ok && r.body) {
        const reader = r.body.getReader(), text = new TextDecoder();
        let buffer = "";
        for (;;) {
          const {value, done} = await reader.read();
          if (done) break;
          buffer += text.decode(value, {stream: true});
          const events = buffer.split("\\n\\n");
          buffer = events.pop();
          if (events.some((e) => e.startsWith("data:"))) schedule();
        }
      }
    } catch (e) { /* the sandbox is stopping or restarting: try again */ }
    await new Promise((done) => setTimeout(done, 1000));
  }
}
listen();
schedule();
</script>
</body>
</html>
""".replace("@@HEADER@@", TOKEN_HEADER)
