// AudioWorklet: microphone floats -> 16 kHz mono PCM s16le frames of 100 ms, plus a level.
// The AudioContext runs at 16 kHz where the browser allows it; otherwise frames are
// resampled here by linear interpolation.

const TARGET_RATE = 16000;
const FRAME = 1600; // samples per message (100 ms at 16 kHz)

class PcmProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.step = sampleRate / TARGET_RATE;
    this.position = 0; // fractional read position into the input stream
    this.previous = 0; // last input sample of the previous block
    this.out = new Int16Array(FRAME);
    this.filled = 0;
    this.peak = 0;
  }

  push(value) {
    const clamped = Math.max(-1, Math.min(1, value));
    this.out[this.filled++] = clamped < 0 ? clamped * 0x8000 : clamped * 0x7fff;
    this.peak = Math.max(this.peak, Math.abs(clamped));
    if (this.filled === FRAME) {
      this.port.postMessage({ pcm: this.out.buffer, level: this.peak }, [this.out.buffer]);
      this.out = new Int16Array(FRAME);
      this.filled = 0;
      this.peak = 0;
    }
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (!channel) return true;
    if (this.step === 1) {
      for (let i = 0; i < channel.length; i++) this.push(channel[i]);
      return true;
    }
    // position is relative to the start of this block; index -1 is the previous sample.
    while (this.position < channel.length - 1) {
      const i = Math.floor(this.position);
      const frac = this.position - i;
      const a = i < 0 ? this.previous : channel[i];
      this.push(a + (channel[i + 1] - a) * frac);
      this.position += this.step;
    }
    this.previous = channel[channel.length - 1];
    this.position -= channel.length;
    return true;
  }
}

registerProcessor("pcm-s16le", PcmProcessor);
