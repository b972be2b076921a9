// Upload: pick or drop a file, stream its transcript segment by segment (the SSE stream
// /v1/audio/transcriptions/stream, whose events carry start/end), downloads. With
// "Speakers", OpenAI's diarized stream instead: one `transcript.text.segment` per speaker
// turn, shown coloured by speaker, and subtitles downloaded with the labels. With "Channels"
// (a call with one speaker per channel), the same stream with multichannel=true: each
// channel transcribed on its own, its segments labelled `channel 0`, `channel 1`, …

import { apiFetch } from "./api.js";
import { $, clock, saveBlob, showError, sseEvents } from "./util.js";

let file = null;
let transcript = "";
let duration = 0;
let language = "";
const speakerColours = new Map(); // speaker label -> colour index, by order of first speech

// The file's duration from its metadata (the progress bar's denominator), or 0.
function probeDuration(blob) {
  return new Promise((resolve) => {
    const audio = document.createElement("audio");
    const url = URL.createObjectURL(blob);
    const done = (value) => {
      URL.revokeObjectURL(url);
      resolve(Number.isFinite(value) ? value : 0);
    };
    audio.preload = "metadata";
    audio.onloadedmetadata = () => done(audio.duration);
    audio.onerror = () => done(0);
    setTimeout(() => done(0), 3000);
    audio.src = url;
  });
}

function setState(state, message) {
  $("upload-status").textContent = message;
  $("upload-status").dataset.state = state;
  const busy = state === "running";
  $("upload-start").disabled = busy || !file;
  for (const id of ["dl-txt", "dl-srt", "dl-vtt"]) $(id).disabled = busy || state !== "done";
}

function setProgress(fraction) {
  $("progress-bar").style.width = `${Math.round(Math.min(1, Math.max(0, fraction)) * 100)}%`;
}

function chooseFile(chosen) {
  if (!chosen) return;
  file = chosen;
  $("file-name").textContent = `${file.name} (${(file.size / 1e6).toFixed(1)} MB)`;
  setState("ready", "Ready to transcribe.");
}

function addSegment(event) {
  if (!event.text) return;
  const item = document.createElement("li");
  const time = document.createElement("span");
  time.className = "time";
  time.textContent = `${clock(event.start)} – ${clock(event.end)}`;
  const text = document.createElement("span");
  text.textContent = event.text;
  item.append(time);
  if (event.speaker) {
    if (!speakerColours.has(event.speaker)) speakerColours.set(event.speaker, speakerColours.size);
    const who = document.createElement("span");
    who.className = `speaker s${speakerColours.get(event.speaker) % 6}`;
    who.textContent = event.speaker;
    item.dataset.speaker = event.speaker;
    item.append(who);
  }
  item.append(text);
  $("segments").append(item);
  item.scrollIntoView({ block: "nearest" });
}

function form(extra = {}) {
  const body = new FormData();
  body.append("file", file, file.name);
  const language = $("upload-language").value;
  if (language && language !== "auto") body.append("language", language);
  for (const [name, value] of Object.entries(extra)) body.append(name, value);
  return body;
}

async function transcribe() {
  if (!file) return;
  $("segments").replaceChildren();
  showError($("upload-error"), "");
  transcript = "";
  language = "";
  setProgress(0);
  setState("running", "Uploading…");
  try {
    duration = await probeDuration(file);
    const speakers = $("speakers").checked;
    const channels = $("channels").checked;
    speakerColours.clear();
    const labelled = { response_format: "diarized_json", stream: "true" };
    const response =
      speakers || channels
        ? await apiFetch("/v1/audio/transcriptions", {
            method: "POST",
            body: form(channels ? { ...labelled, multichannel: "true" } : labelled),
          })
        : await apiFetch("/v1/audio/transcriptions/stream", { method: "POST", body: form() });
    setState("running", "Transcribing…");
    for await (const data of sseEvents(response)) {
      if (data === "[DONE]") break;
      const event = JSON.parse(data);
      if (event.error) throw new Error(event.error.message);
      if (event.type === "transcript.text.segment") {
        addSegment(event);
        if (duration) setProgress(event.end / duration);
        setState("running", `Transcribing… ${clock(event.end)}${duration ? ` of ${clock(duration)}` : ""}`);
      } else if (event.type === "transcript.text.done") {
        transcript = event.text || "";
        language = (event.languages || []).map((l) => l.code).join(", ");
      } else if (event.type === "segment") {
        addSegment(event);
        if (duration) setProgress(event.end / duration);
        setState("running", `Transcribing… ${clock(event.end)}${duration ? ` of ${clock(duration)}` : ""}`);
      } else if (event.type === "done") {
        transcript = event.text || "";
        duration = event.duration || duration;
        language = event.language || "";
      }
    }
    setProgress(1);
    setState("done", `Done: ${clock(duration)} of audio${language ? `, ${language}` : ""}.`);
  } catch (error) {
    setProgress(0);
    showError($("upload-error"), error.message);
    setState("error", "Failed.");
  }
}

function baseName() {
  return (file?.name || "transcript").replace(/\.[^.]+$/, "");
}

async function downloadSubtitles(format) {
  const button = $(`dl-${format}`);
  button.disabled = true;
  showError($("upload-error"), "");
  const previous = $("upload-status").textContent;
  $("upload-status").textContent = `Making .${format} subtitles…`;
  try {
    // a call's channels: the transcription route's cues, labelled by channel
    const response = $("channels").checked
      ? await apiFetch("/v1/audio/transcriptions", {
          method: "POST",
          body: form({ response_format: format, multichannel: "true" }),
        })
      : await apiFetch("/v1/audio/subtitles", {
          method: "POST",
          body: form({
            response_format: format,
            mode: $("sub-mode").value,
            ...($("speakers").checked ? { diarize: "true" } : {}),
          }),
        });
    saveBlob(await response.blob(), `${baseName()}.${format}`);
    $("upload-status").textContent = previous;
  } catch (error) {
    showError($("upload-error"), error.message);
    $("upload-status").textContent = previous;
  } finally {
    button.disabled = false;
  }
}

export function setupUpload() {
  const input = $("file");
  input.addEventListener("change", () => chooseFile(input.files[0]));
  const drop = $("drop");
  for (const name of ["dragenter", "dragover"]) {
    drop.addEventListener(name, (event) => {
      event.preventDefault();
      drop.classList.add("over");
    });
  }
  for (const name of ["dragleave", "drop"]) {
    drop.addEventListener(name, () => drop.classList.remove("over"));
  }
  drop.addEventListener("drop", (event) => {
    event.preventDefault();
    chooseFile(event.dataTransfer.files[0]);
  });
  $("upload-start").addEventListener("click", transcribe);
  // Speakers (diarization) and Channels (one speaker per channel) label the same thing
  $("speakers").addEventListener("change", () => {
    if ($("speakers").checked) $("channels").checked = false;
  });
  $("channels").addEventListener("change", () => {
    if ($("channels").checked) $("speakers").checked = false;
  });
  $("dl-txt").addEventListener("click", () =>
    saveBlob(new Blob([`${transcript}\n`], { type: "text/plain" }), `${baseName()}.txt`),
  );
  $("dl-srt").addEventListener("click", () => downloadSubtitles("srt"));
  $("dl-vtt").addEventListener("click", () => downloadSubtitles("vtt"));
}
