// Live: microphone -> AudioWorklet (16 kHz PCM s16le) -> /ws/transcribe; partials with the
// stable prefix set apart, finals with their times, VAD/language, level meter, reconnects.
// With an API key the page speaks /v1/realtime instead, opened with a client secret
// (realtime.js), so the key itself never travels on the WebSocket.

import { apiKey, openSocket, unauthorized } from "./api.js";
import { appendAudio, COMMIT, openRealtime, sessionUpdate } from "./realtime.js";
import { $, clock, showError } from "./util.js";

const RECONNECT_DELAYS_MS = [500, 1000, 2000, 4000, 8000];
const FATAL_CODES = new Set(["UNAUTHORIZED", "UNSUPPORTED_SAMPLE_RATE", "UNSUPPORTED_LANGUAGE"]);

let running = false;
let audio = null; // {context, stream, node}
let socket = null;
let realtime = false; // this socket speaks /v1/realtime (the page has an API key)
let ready = false; // /v1/realtime: session.updated came, so appended audio is 16 kHz
let deltas = ""; // /v1/realtime: the open utterance's text so far
let connects = 0; // the latest connect() wins (minting a secret takes a round trip)
let attempts = 0;
let startedAt = 0; // performance.now() when the microphone started
let utteranceStart = null; // seconds since start when the open utterance's first partial came

function elapsed() {
  return (performance.now() - startedAt) / 1000;
}

function status(text) {
  $("live-status").textContent = text;
}

function setPartial(stable, text) {
  const tail = text.startsWith(stable) ? text.slice(stable.length) : text;
  const node = $("partial");
  node.querySelector(".stable").textContent = text.startsWith(stable) ? stable : "";
  node.querySelector(".unstable").textContent = tail;
  node.dataset.count = String(Number(node.dataset.count || 0) + 1);
}

function addFinal(text) {
  const end = elapsed();
  const item = document.createElement("li");
  const time = document.createElement("span");
  time.className = "time";
  time.textContent = `${clock(utteranceStart ?? end)} – ${clock(end)}`;
  const body = document.createElement("span");
  body.textContent = text;
  item.append(time, body);
  $("finals").append(item);
  item.scrollIntoView({ block: "nearest" });
  utteranceStart = null;
  setPartial("", "");
}

function onMessage(event) {
  if (typeof event.data !== "string") return;
  const message = JSON.parse(event.data);
  if (message.code) {
    showError($("live-error"), `${message.message} (${message.code})`);
    if (message.code === "UNAUTHORIZED") unauthorized(message.message);
    if (FATAL_CODES.has(message.code) || message.code === "TOO_MANY_SESSIONS") stop();
  } else if (message.status === "connected") {
    attempts = 0;
    showError($("live-error"), "");
    status(`Listening (${message.use_server_vad ? "server VAD" : "VAD off: flush to finish"}).`);
  } else if (message.is_partial) {
    utteranceStart ??= elapsed();
    setPartial(message.stable_text || "", message.text || "");
  } else if (message.is_final) {
    if (message.text) addFinal(message.text);
    else setPartial("", "");
  }
}

// /v1/realtime events -> the same view as /ws/transcribe's (its deltas are stable text only).
function onRealtimeMessage(event) {
  const message = JSON.parse(event.data);
  switch (message.type) {
    case "session.created":
      socket?.send(sessionUpdate($("live-language").value, $("vad").checked));
      break;
    case "session.updated":
      ready = true;
      attempts = 0;
      showError($("live-error"), "");
      status(`Listening (${$("vad").checked ? "server VAD" : "VAD off: flush to finish"}).`);
      break;
    case "input_audio_buffer.speech_started":
      utteranceStart ??= elapsed();
      break;
    case "conversation.item.input_audio_transcription.delta":
      utteranceStart ??= elapsed();
      deltas += message.delta;
      setPartial(deltas, deltas);
      break;
    case "conversation.item.input_audio_transcription.completed":
      deltas = "";
      if (message.transcript) addFinal(message.transcript);
      else setPartial("", "");
      break;
    case "conversation.item.input_audio_transcription.failed":
      showError($("live-error"), message.error.message);
      break;
    case "error": {
      const { code, message: text } = message.error;
      if (code === "input_audio_buffer_commit_empty") break; // flush with nothing buffered
      showError($("live-error"), `${text} (${code})`);
      if (code === "invalid_api_key") unauthorized(text);
      if (["invalid_api_key", "too_many_sessions"].includes(code)) stop();
      break;
    }
  }
}

async function openLive() {
  const language = $("live-language").value;
  if (!apiKey()) {
    const params = { sample_rate: "16000", use_server_vad: String($("vad").checked) };
    if (language && language !== "auto") params.language = language;
    return openSocket("/ws/transcribe", params);
  }
  return openRealtime();
}

async function connect() {
  const generation = ++connects;
  status("Connecting…");
  let ws;
  try {
    ws = await openLive();
  } catch (error) {
    showError($("live-error"), error.message); // minting the client secret failed
    stop();
    return;
  }
  if (!running || generation !== connects) {
    ws.close();
    return;
  }
  realtime = Boolean(apiKey());
  ready = false;
  deltas = "";
  ws.binaryType = "arraybuffer";
  ws.onmessage = realtime ? onRealtimeMessage : onMessage;
  ws.onclose = (event) => {
    if (socket !== ws) return;
    socket = null;
    if (!running) return;
    if (event.code === 1008 || attempts >= RECONNECT_DELAYS_MS.length) {
      status("Disconnected.");
      stop();
      return;
    }
    const delay = RECONNECT_DELAYS_MS[attempts++];
    status(`Connection lost; reconnecting in ${delay / 1000} s…`);
    setTimeout(() => running && !socket && connect(), delay);
  };
  socket = ws;
}

async function startAudio() {
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false },
  });
  let context;
  try {
    context = new AudioContext({ sampleRate: 16000 });
  } catch {
    context = new AudioContext(); // the worklet resamples
  }
  await context.audioWorklet.addModule("/ui/static/js/pcm-worklet.js");
  const source = context.createMediaStreamSource(stream);
  const node = new AudioWorkletNode(context, "pcm-s16le");
  node.port.onmessage = ({ data }) => {
    $("level").style.width = `${Math.min(100, Math.round(Math.sqrt(data.level) * 100))}%`;
    if (!socket || socket.readyState !== WebSocket.OPEN) return;
    if (!realtime) socket.send(data.pcm);
    else if (ready) socket.send(appendAudio(data.pcm));
  };
  source.connect(node);
  return { context, stream, node };
}

async function start() {
  showError($("live-error"), "");
  running = true;
  attempts = 0;
  updateButtons();
  try {
    audio = await startAudio();
  } catch (error) {
    showError($("live-error"), `Microphone: ${error.message}`);
    stop();
    return;
  }
  startedAt = performance.now();
  utteranceStart = null;
  connect();
}

function stop() {
  running = false;
  const ws = socket;
  socket = null;
  if (ws) {
    if (ws.readyState === WebSocket.OPEN) {
      // The open utterance gets its final, then the socket closes.
      ws.send(realtime ? COMMIT : JSON.stringify({ action: "flush" }));
      ws.onclose = null;
      setTimeout(() => ws.close(1000), 3000);
    } else {
      ws.close();
    }
  }
  if (audio) {
    audio.node.port.onmessage = null;
    for (const track of audio.stream.getTracks()) track.stop();
    audio.context.close();
    audio = null;
  }
  $("level").style.width = "0";
  status("Microphone off.");
  updateButtons();
}

function updateButtons() {
  const toggle = $("live-toggle");
  toggle.textContent = running ? "Stop microphone" : "Start microphone";
  toggle.setAttribute("aria-pressed", String(running));
  $("live-flush").disabled = !running;
}

function sendConfig() {
  if (!socket || socket.readyState !== WebSocket.OPEN) return;
  const language = $("live-language").value;
  if (realtime) {
    socket.send(sessionUpdate(language, $("vad").checked));
    return;
  }
  socket.send(
    JSON.stringify({ action: "config", language: language || "auto", use_server_vad: $("vad").checked }),
  );
}

export function setupLive() {
  $("live-toggle").addEventListener("click", () => (running ? stop() : start()));
  $("live-flush").addEventListener("click", () => {
    if (socket && socket.readyState === WebSocket.OPEN) {
      socket.send(realtime ? COMMIT : JSON.stringify({ action: "flush" }));
    }
  });
  $("vad").addEventListener("change", sendConfig);
  $("live-language").addEventListener("change", sendConfig);
}
