// The page: lists the server's models and voices, sends the speech request as a streamed fetch (so Stop can abort
// it, and the API key can go in a header) of server-sent events, and hands each event's audio to a sink from
// audio.js; the last event says how the text was read out (its transcript, its language), shown under the status.
// With "Highlight each word" (a model the server times words for), each sentence's timestamps event adds its words
// to #words, and the one being heard (the sink's play position) is marked.
// What it measured is shown under "Playback" and kept in #result's data attributes (state, format, bytes, samples,
// ttfaMs), which tests/server/test_web_page.py reads.
import { FORMATS, Output, makeSink, playbackOf } from "./audio.js";
import { Waveform } from "./waveform.js";

const $ = (id) => document.getElementById(id);
const form = $("speak-form"), result = $("result"), output = new Output();
const waveform = new Waveform($("waveform"), $("show-waveform"));
const HINTS = {
  samples: "Plays while it streams (decoded here, through Web Audio).",
  media: "Plays while it streams (through the browser's MediaSource).",
  complete: "This browser cannot stream this format: it plays once complete, and can then be downloaded.",
};
let run = null; // the request in flight or playing, if any
let timed = new Set(); // the models whose words the server times

class ApiError extends Error {
  constructor(status, detail) {
    super(detail.message || `the server answered ${status}`);
    Object.assign(this, { status, code: detail.code, param: detail.param });
  }
}

function authorization() {
  const key = $("api-key").value.trim();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

// Relative paths: under a proxy's prefix they stay under it.
async function api(path, init = {}) {
  const response = await fetch(path, { ...init, headers: { ...authorization(), ...init.headers } });
  if (!response.ok) throw await apiError(response);
  return response;
}

async function apiError(response) {
  let detail = {};
  try {
    detail = (await response.json()).error || {};
  } catch {
    // not the server's JSON envelope (a proxy's error page, say): the status says enough
  }
  return new ApiError(response.status, detail);
}

// Models and voices ------------------------------------------------------------------------------------------
async function loadListing() {
  setStatus("Loading the voices…");
  try {
    const cards = (await (await api("v1/models")).json()).data;
    timed = new Set(cards.filter((m) => m.timestamps).map((m) => m.id));
    fill($("model"), [["", cards.map((m) => [m.id, m.id])]]);
    showTimestamps();
    await loadVoices();
    clearError();
    $("api-key").removeAttribute("aria-invalid");
    setStatus("Ready.");
  } catch (err) {
    showError(err);
    setStatus("Could not load the voices.");
    if (err.status === 401) {
      $("api-key").setAttribute("aria-invalid", "true");
      $("api-key").focus();
    }
  }
}

// Built-in voices, then the ones created in the server's voice library (by id: a name could be taken again).
async function loadVoices() {
  const model = encodeURIComponent($("model").value);
  const voices = (await (await api(`v1/audio/voices?model=${model}`)).json()).data;
  const builtIn = voices.filter((v) => v.object !== "audio.voice");
  const created = voices.filter((v) => v.object === "audio.voice");
  fill($("voice"), [
    ["Built-in", builtIn.map((v) => [v.id, v.alias_of ? `${v.name} (${v.alias_of})` : v.name])],
    ["Created", created.map((v) => [v.id, v.name])],
  ]);
}

// Options in groups ("" for none), keeping the current choice when it is still there.
function fill(select, groups) {
  const kept = select.value;
  select.replaceChildren();
  for (const [label, options] of groups) {
    if (!options.length) continue;
    const parent = label ? document.createElement("optgroup") : select;
    if (label) {
      parent.label = label;
      select.append(parent);
    }
    for (const [value, text] of options) parent.append(new Option(text, value, false, value === kept));
  }
}

// Speaking -------------------------------------------------------------------------------------------------------
function requestBody(format) {
  const body = {
    model: $("model").value, input: $("text").value, voice: $("voice").value, response_format: format,
    speed: Number($("speed").value), stream_format: "sse",
  };
  const seed = $("seed");
  if (seed.validity.badInput) throw new Error("Seed: a whole number, or empty for a random one");
  if (seed.value !== "") body.seed = Number(seed.value);
  if ($("timestamps").checked && !$("timestamps").disabled) body.timestamps = "word";
  return body;
}

async function speak() {
  stop(false);
  const format = $("format").value;
  const current = { controller: new AbortController(), started: performance.now(), bytes: 0, parts: [], format };
  run = current;
  begin(current);
  try {
    output.ready();
    current.sink = makeSink(format, output, (leadMs) => firstAudio(current, leadMs));
    waveform.start(output.analyser);
    const response = await api("v1/audio/speech", {
      method: "POST", headers: { "Content-Type": "application/json" }, signal: current.controller.signal,
      body: JSON.stringify(requestBody(format)),
    });
    setState(current, "streaming", playbackOf(format) === "complete" ? "Receiving…" : "Playing while it streams…");
    await receive(current, response.body.getReader());
    current.sink.end();
    offerDownload(current);
    setState(current, "received", "All received; playing the rest…");
    await current.sink.finished;
    end(current, "done", "Done.");
  } catch (err) {
    if (current.controller.signal.aborted) return; // stopped: stop() has said so
    current.sink?.stop();
    end(current, "error", "Failed.");
    showError(err);
  }
}

async function receive(current, reader) {
  const text = new TextDecoder();
  let pending = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return;
    pending += text.decode(value, { stream: true }).replaceAll("\r\n", "\n");
    let end;
    while ((end = pending.indexOf("\n\n")) >= 0) { // one event per blank line
      const lines = pending.slice(0, end).split("\n");
      pending = pending.slice(end + 2);
      for (const line of lines) if (line.startsWith("data: ")) take(current, JSON.parse(line.slice(6)));
    }
  }
}

function take(current, event) {
  if (event.type === "speech.audio.delta") {
    const audio = Uint8Array.from(atob(event.audio), (c) => c.charCodeAt(0));
    current.parts.push(audio);
    current.bytes += audio.length;
    current.sink.push(audio);
    report(current);
  } else if (event.type === "speech.audio.timestamps") {
    showWords(current, event.words);
  } else if (event.type === "speech.audio.done") {
    showTranscript(event);
  } else if (event.type === "error") {
    throw new Error(event.error?.message || "the speech failed");
  }
}

// How the text was read out: numbers as words, respellings, pauses as tags; and in which language.
function showTranscript(done) {
  const said = $("transcript");
  const cut = done.status === "incomplete" ? ` (cut short: ${done.status_details?.reason})` : "";
  said.textContent = `Read out${done.language ? ` in ${done.language}` : ""}: ${done.transcript ?? ""}${cut}`;
  said.dataset.transcript = done.transcript ?? "";
  said.dataset.language = done.language ?? "";
  said.hidden = false;
}

// The words of each sentence as their timestamps come; the one being heard follows the sink's play position.
function showWords(current, words) {
  const box = $("words");
  for (const w of words) {
    const span = document.createElement("span");
    Object.assign(span.dataset, { start: String(w.start), end: String(w.end) });
    span.textContent = w.word;
    box.append(span, " ");
  }
  box.hidden = false;
  result.dataset.words = String(box.querySelectorAll("span").length);
  if (!current.follow) current.follow = requestAnimationFrame(() => follow(current));
}

function follow(current) {
  const at = current.sink?.heard?.();
  let now = null;
  if (at !== undefined) {
    for (const span of $("words").querySelectorAll("span")) {
      if (Number(span.dataset.start) <= at) now = span;
    }
  }
  for (const span of $("words").querySelectorAll("span[aria-current]")) {
    if (span !== now) span.removeAttribute("aria-current");
  }
  if (now) {
    now.setAttribute("aria-current", "true");
    result.dataset.heardWord = now.textContent;
  }
  current.follow = run === current ? requestAnimationFrame(() => follow(current)) : 0;
}

function showTimestamps() {
  const box = $("timestamps"), can = timed.has($("model").value);
  box.disabled = !can;
  $("timestamps-hint").textContent = can ? "" : "The server times words only with --aligner.";
}

// Stop: abort the fetch (the server sees the connection close and frees the request) and silence what is queued.
function stop(say = true) {
  const current = run;
  if (!current) return;
  current.controller.abort();
  current.sink?.stop();
  end(current, "stopped", "Stopped.");
  if (!say) setStatus("");
}

function begin(current) {
  clearError();
  $("download").hidden = true;
  $("transcript").hidden = true;
  $("words").replaceChildren();
  $("words").hidden = true;
  delete result.dataset.words;
  delete result.dataset.heardWord;
  Object.assign(result.dataset, { format: current.format, bytes: "0", samples: "", ttfaMs: "" });
  for (const [id, text] of [["stat-ttfa", "–"], ["stat-samples", "–"], ["stat-seconds", "–"], ["stat-bytes", "0"]]) {
    $(id).textContent = text;
  }
  $("stop").disabled = false;
  setState(current, "requesting", "Sending the text…");
}

function end(current, state, text) {
  if (run !== current) return;
  setState(current, state, text);
  run = null;
  waveform.stop();
  if (document.activeElement === $("stop")) $("speak").focus(); // a disabled button would drop the focus
  $("stop").disabled = true;
}

function setState(current, state, text) {
  if (run !== current) return; // a request replaced by a newer one says nothing
  result.dataset.state = state;
  result.setAttribute("aria-busy", String(state === "requesting" || state === "streaming"));
  setStatus(text);
}

function firstAudio(current, leadMs) {
  if (run !== current) return;
  const ms = performance.now() - current.started + leadMs; // until the first sample sounds
  result.dataset.ttfaMs = ms.toFixed(1);
  $("stat-ttfa").textContent = `${Math.round(ms)} ms`;
}

function report(current) {
  const { sink } = current;
  result.dataset.bytes = String(current.bytes);
  $("stat-bytes").textContent = current.bytes.toLocaleString("en");
  if (sink.samples === undefined) {
    $("stat-samples").textContent = "– (compressed)";
    return;
  }
  result.dataset.samples = String(sink.samples);
  $("stat-samples").textContent = sink.samples.toLocaleString("en");
  $("stat-seconds").textContent = `${(sink.samples / sink.rate).toFixed(2)} s`;
}

function offerDownload(current) {
  const { mime, ext } = FORMATS[current.format];
  const link = $("download-link");
  if (link.href.startsWith("blob:")) URL.revokeObjectURL(link.href);
  link.href = URL.createObjectURL(new Blob(current.parts, { type: mime }));
  link.download = `speech.${ext}`;
  link.textContent = `Download the audio (${ext}, ${current.bytes.toLocaleString("en")} bytes)`;
  $("download").hidden = false;
}

// Messages ---------------------------------------------------------------------------------------------------------
function setStatus(text) {
  $("status").textContent = text;
}

function showError(err) {
  const box = $("error");
  if (err instanceof ApiError) {
    const key = err.status === 401 ? " Enter the server's API key above." : "";
    box.textContent = `Error ${err.status}${err.code ? ` (${err.code})` : ""}: ${err.message}${key}`;
  } else if (err instanceof TypeError) { // what fetch and a body read throw when the connection fails
    box.textContent = `The connection to the server failed or was cut short: ${err.message}`;
  } else {
    box.textContent = `Error: ${err.message}`;
  }
  box.hidden = false;
}

function clearError() {
  $("error").hidden = true;
  $("error").textContent = "";
}

// Controls ---------------------------------------------------------------------------------------------------------
function showFormat() {
  $("format-hint").textContent = HINTS[playbackOf($("format").value)];
}

function showSpeed() {
  $("speed-value").textContent = `${Number($("speed").value).toFixed(2)}×`;
}

form.addEventListener("submit", (event) => {
  event.preventDefault();
  speak();
});
$("stop").addEventListener("click", () => stop());
$("text").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    form.requestSubmit();
  }
});
// A new key loads the voices with it: on Enter (instead of speaking, the form's default) or on leaving the field.
let listedKey = "";
function keyChanged() {
  if ($("api-key").value.trim() === listedKey) return;
  listedKey = $("api-key").value.trim();
  loadListing();
}
$("api-key").addEventListener("keydown", (event) => {
  if (event.key === "Enter") {
    event.preventDefault();
    keyChanged();
  }
});
$("api-key").addEventListener("change", keyChanged);
$("model").addEventListener("change", () => {
  showTimestamps();
  loadVoices().catch(showError);
});
$("format").addEventListener("change", showFormat);
$("speed").addEventListener("input", showSpeed);
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && run) stop();
});
showFormat();
showSpeed();
loadListing();
