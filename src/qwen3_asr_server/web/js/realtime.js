// The live microphone's /v1/realtime wire, used when the page holds an API key: the key mints
// a short-lived client secret (POST /v1/realtime/client_secrets), and only that `ek_` secret
// travels on the WebSocket (in the `openai-insecure-api-key.` subprotocol). Audio is the
// worklet's 16 kHz PCM s16le, base64 in `input_audio_buffer.append` (16 kHz is this server's
// extension of OpenAI's 24 kHz).

import { apiFetch, openSocket } from "./api.js";

const SECRET_SECONDS = 60; // the secret only has to open the socket; the session outlives it

export async function openRealtime() {
  const response = await apiFetch("/v1/realtime/client_secrets", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({
      expires_after: { anchor: "created_at", seconds: SECRET_SECONDS },
      session: { type: "transcription" },
    }),
  });
  const { value } = await response.json();
  return openSocket("/v1/realtime", { intent: "transcription" }, value);
}

export function sessionUpdate(language, useVad) {
  const input = {
    format: { type: "audio/pcm", rate: 16000 },
    transcription: { language: language && language !== "auto" ? language : null },
    turn_detection: useVad ? { type: "server_vad" } : null,
  };
  return JSON.stringify({ type: "session.update", session: { type: "transcription", audio: { input } } });
}

export function appendAudio(pcm) {
  const bytes = new Uint8Array(pcm);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return JSON.stringify({ type: "input_audio_buffer.append", audio: btoa(binary) });
}

export const COMMIT = JSON.stringify({ type: "input_audio_buffer.commit" });
