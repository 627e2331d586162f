// Playback of a response body while it arrives. Each format has a sink: push(bytes) as chunks come, end() when
// the body is complete, stop() to cut; `finished` resolves once everything has been played (or it was stopped).
//   pcm, wav:  decoded here into samples and scheduled on the AudioContext chunk after chunk (Web Audio).
//   mp3, aac:  appended to a MediaSource that the page's <audio> element plays, when the browser takes the type.
//   opus, flac (or a type MediaSource refuses): collected, then played once complete; the page says so.
// Everything goes through one AnalyserNode, which the waveform reads.

const LEAD_S = 0.1; // the first chunk starts this far ahead, so the next one has time to arrive
const PCM_RATE = 24000; // `pcm` is 24 kHz s16le mono

export const FORMATS = {
  pcm: { mime: "audio/pcm", ext: "pcm", how: "samples" },
  wav: { mime: "audio/wav", ext: "wav", how: "samples" },
  mp3: { mime: "audio/mpeg", ext: "mp3", how: "media" },
  aac: { mime: "audio/aac", ext: "aac", how: "media" },
  opus: { mime: "audio/ogg", ext: "opus", how: "complete" },
  flac: { mime: "audio/flac", ext: "flac", how: "complete" },
};

// How the page will play a format here: "samples", "media" (streamed through MediaSource) or "complete".
export function playbackOf(format) {
  const { how, mime } = FORMATS[format];
  if (how !== "media") return how;
  return window.MediaSource && MediaSource.isTypeSupported(mime) ? "media" : "complete";
}

// The AudioContext, the analyser and the <audio> element, made on the first Speak (a user gesture, which lets
// the browser start audio) and kept for the page's life.
export class Output {
  constructor() {
    this.ctx = null;
    this.element = new Audio();
  }

  ready() {
    if (!this.ctx) {
      this.ctx = new AudioContext();
      this.analyser = this.ctx.createAnalyser();
      this.analyser.fftSize = 2048;
      this.input = this.ctx.createGain();
      this.input.connect(this.analyser);
      this.analyser.connect(this.ctx.destination);
      this.ctx.createMediaElementSource(this.element).connect(this.input);
    }
    // Not awaited: without a user gesture the promise waits for one, and the samples still count meanwhile.
    if (this.ctx.state !== "running") this.ctx.resume();
  }
}

export function makeSink(format, output, onFirstAudio) {
  const how = playbackOf(format);
  if (how === "samples") return new SampleSink(output, format === "wav" ? new WavHeader() : null, onFirstAudio);
  if (how === "media") return new MediaSink(output, FORMATS[format].mime, onFirstAudio);
  return new CompleteSink(output, FORMATS[format].mime, onFirstAudio);
}

class Finishing {
  constructor() {
    this.finished = new Promise((resolve, reject) => { this.resolve = resolve; this.reject = reject; });
  }
}

// pcm and wav: 16-bit samples to Float32, one AudioBufferSourceNode per chunk, each starting where the last ends.
class SampleSink extends Finishing {
  constructor(output, header, onFirstAudio) {
    super();
    Object.assign(this, { output, header, onFirstAudio, rate: PCM_RATE, samples: 0, next: 0, ended: false });
    this.sources = new Set();
    this.starts = [];
    this.odd = null; // a chunk can end inside a sample: its first byte waits for the next chunk
  }

  push(bytes) {
    if (this.header) {
      bytes = this.header.take(bytes);
      if (!bytes) return;
      this.rate = this.header.rate;
      this.header = null;
    }
    this.play(this.int16(bytes));
  }

  int16(bytes) {
    if (this.odd) {
      const joined = new Uint8Array(bytes.length + 1);
      joined.set(this.odd);
      joined.set(bytes, 1);
      bytes = joined;
    }
    const n = bytes.length >> 1;
    this.odd = bytes.length & 1 ? bytes.slice(-1) : null;
    const view = new DataView(bytes.buffer, bytes.byteOffset, n * 2);
    const out = new Float32Array(n);
    for (let i = 0; i < n; i++) out[i] = view.getInt16(2 * i, true) / 32768;
    return out;
  }

  play(floats) {
    if (!floats.length) return;
    const ctx = this.output.ctx;
    const buffer = ctx.createBuffer(1, floats.length, this.rate); // the node resamples to the context's rate
    buffer.copyToChannel(floats, 0);
    const source = ctx.createBufferSource();
    source.buffer = buffer;
    source.connect(this.output.input);
    // after an underrun (the next chunk came late) start again a little ahead rather than in the past
    const at = Math.max(this.next, ctx.currentTime + LEAD_S);
    source.start(at);
    this.starts.push([at, this.samples / this.rate]); // where this chunk sounds, and its place in the response
    this.next = at + buffer.duration;
    this.sources.add(source);
    source.onended = () => { this.sources.delete(source); this.check(); };
    if (this.samples === 0) this.onFirstAudio((at - ctx.currentTime) * 1000);
    this.samples += floats.length;
  }

  // Seconds of the response heard so far (undefined before the first sample sounds).
  heard() {
    const now = this.output.ctx.currentTime;
    let last;
    for (const entry of this.starts) if (entry[0] <= now) last = entry;
    return last && Math.min(last[1] + now - last[0], this.samples / this.rate);
  }

  end() {
    if (this.header) throw new Error("the response ended inside its WAV header");
    this.ended = true;
    this.check();
  }

  check() {
    if (this.ended && this.sources.size === 0) this.resolve();
  }

  stop() {
    for (const source of this.sources) {
      source.onended = null;
      source.stop();
    }
    this.sources.clear();
    this.resolve();
  }
}

// A streamed WAV's header (its sizes are 0xFFFFFFFF: a stream cannot know them): read up to the `data` chunk,
// taking the sample rate from `fmt `. take() returns the bytes after the header once it is complete.
class WavHeader {
  constructor() {
    this.bytes = new Uint8Array(0);
  }

  take(chunk) {
    const all = new Uint8Array(this.bytes.length + chunk.length);
    all.set(this.bytes);
    all.set(chunk, this.bytes.length);
    this.bytes = all;
    const view = new DataView(all.buffer);
    if (all.length >= 4 && tag(view, 0) !== "RIFF") throw new Error("the response is not a WAV file");
    // a chunk's size is odd only if a pad byte follows it (RIFF)
    for (let at = 12, size; at + 8 <= all.length; at += 8 + size + (size & 1)) {
      const id = tag(view, at);
      size = view.getUint32(at + 4, true);
      if (id === "data" && !this.rate) throw new Error("a WAV without a fmt chunk before its data");
      if (id === "data") return all.subarray(at + 8);
      if (id === "fmt " && at + 24 > all.length) return null;
      if (id === "fmt ") this.checkFormat(view, at + 8);
    }
    if (all.length > 4096) throw new Error("no data chunk in the WAV header");
    return null;
  }

  checkFormat(view, at) {
    const channels = view.getUint16(at + 2, true), bits = view.getUint16(at + 14, true);
    if (channels !== 1 || bits !== 16) throw new Error(`a ${channels}-channel ${bits}-bit WAV: expected mono 16-bit`);
    this.rate = view.getUint32(at + 4, true);
  }
}

function tag(view, at) {
  return String.fromCharCode(...[0, 1, 2, 3].map((i) => view.getUint8(at + i)));
}

// The <audio> element's events: first audio at "playing", done at "ended", a decoding failure as an error.
class ElementSink extends Finishing {
  constructor(output, onFirstAudio) {
    super();
    this.element = output.element;
    this.element.onplaying = () => { this.element.onplaying = null; onFirstAudio(0); };
    this.element.onended = () => this.resolve();
    this.element.onerror = () => this.reject(new Error("this browser could not play the audio"));
  }

  heard() {
    return this.element.currentTime;
  }

  start(url) {
    this.url = url;
    this.element.src = url;
    this.element.play().catch((err) => { if (err.name !== "AbortError") this.reject(err); });
  }

  stop() {
    Object.assign(this.element, { onplaying: null, onended: null, onerror: null });
    this.element.pause();
    this.element.removeAttribute("src");
    this.element.load();
    if (this.url) URL.revokeObjectURL(this.url);
    this.resolve();
  }
}

// mp3, aac: a MediaSource fed chunk after chunk; the element starts playing after the first append.
class MediaSink extends ElementSink {
  constructor(output, mime, onFirstAudio) {
    super(output, onFirstAudio);
    Object.assign(this, { queue: [], ended: false, buffer: null });
    this.source = new MediaSource();
    this.source.addEventListener("sourceopen", () => {
      this.buffer = this.source.addSourceBuffer(mime);
      this.buffer.addEventListener("updateend", () => this.pump());
      this.pump();
    }, { once: true });
    this.start(URL.createObjectURL(this.source));
  }

  push(bytes) {
    this.queue.push(bytes);
    this.pump();
  }

  end() {
    this.ended = true;
    this.pump();
  }

  // one append at a time (a SourceBuffer takes no other while updating): what queued meanwhile goes as one
  pump() {
    if (!this.buffer || this.buffer.updating || this.source.readyState !== "open") return;
    if (this.queue.length) {
      this.buffer.appendBuffer(concat(this.queue.splice(0)));
    } else if (this.ended) {
      this.source.endOfStream();
    }
  }
}

// opus (Ogg) and flac: MediaSource takes neither container, so the file plays once it is complete.
class CompleteSink extends ElementSink {
  constructor(output, mime, onFirstAudio) {
    super(output, onFirstAudio);
    Object.assign(this, { mime, parts: [] });
  }

  push(bytes) {
    this.parts.push(bytes);
  }

  end() {
    this.start(URL.createObjectURL(new Blob(this.parts, { type: this.mime })));
  }
}

export function concat(parts) {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const part of parts) {
    out.set(part, at);
    at += part.length;
  }
  return out;
}
