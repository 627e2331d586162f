// The live waveform: what the analyser hears, drawn once per animation frame while audio plays. Optional: the page
// works the same without it (its checkbox, or a canvas the browser cannot draw on), and it starts off for people
// who asked their system for less motion.

export class Waveform {
  constructor(canvas, toggle) {
    Object.assign(this, { canvas, toggle, analyser: null, frame: 0 });
    this.g = canvas.getContext && canvas.getContext("2d");
    if (window.matchMedia && matchMedia("(prefers-reduced-motion: reduce)").matches) toggle.checked = false;
    if (!this.g) {
      toggle.checked = false;
      toggle.disabled = true;
    }
    toggle.addEventListener("change", () => this.sync());
    this.sync();
  }

  // Draw from this analyser until stop().
  start(analyser) {
    this.analyser = analyser;
    this.samples = new Float32Array(analyser.fftSize);
    this.sync();
  }

  stop() {
    this.analyser = null;
    this.sync();
  }

  sync() {
    const on = this.toggle.checked && this.g;
    this.canvas.hidden = !on;
    if (on && this.analyser && !this.frame) {
      this.frame = requestAnimationFrame(() => this.draw());
    } else if (!on || !this.analyser) {
      cancelAnimationFrame(this.frame);
      this.frame = 0;
      if (on) this.draw(); // a flat line when idle
    }
  }

  draw() {
    const { canvas, g } = this;
    const w = canvas.width, h = canvas.height;
    if (this.analyser) this.analyser.getFloatTimeDomainData(this.samples);
    const data = this.analyser ? this.samples : new Float32Array(2);
    const style = getComputedStyle(canvas);
    g.clearRect(0, 0, w, h);
    g.lineWidth = 2;
    g.strokeStyle = style.color;
    g.beginPath();
    for (let i = 0; i < data.length; i++) {
      const x = (i / (data.length - 1)) * w, y = (0.5 - Math.max(-1, Math.min(1, data[i])) / 2) * h;
      if (i === 0) g.moveTo(x, y);
      else g.lineTo(x, y);
    }
    g.stroke();
    this.frame = this.analyser ? requestAnimationFrame(() => this.draw()) : 0;
  }
}
