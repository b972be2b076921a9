// The API key (localStorage), authorised fetch, and the server's error messages.

const KEY_STORE = "qwen3-asr-server.api-key";
const keyListeners = [];

export function apiKey() {
  return localStorage.getItem(KEY_STORE) || "";
}

export function setApiKey(key) {
  if (key) localStorage.setItem(KEY_STORE, key);
  else localStorage.removeItem(KEY_STORE);
}

// Called with a message whenever the server answers 401 (the page then asks for a key).
export function onUnauthorized(listener) {
  keyListeners.push(listener);
}

export function unauthorized(message) {
  for (const listener of keyListeners) listener(message);
}

export class ApiError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

// The message from an error body in OpenAI's shape, else the raw text.
export async function errorFrom(response) {
  const text = await response.text();
  let message = text || `${response.status} ${response.statusText}`;
  try {
    const body = JSON.parse(text);
    message = body?.error?.message || body?.detail || body?.message || message;
  } catch {
    /* not JSON */
  }
  if (response.status === 401) unauthorized(message);
  return new ApiError(message, response.status);
}

export async function apiFetch(path, options = {}) {
  const headers = new Headers(options.headers || {});
  const key = apiKey();
  if (key) headers.set("Authorization", `Bearer ${key}`);
  const response = await fetch(path, { ...options, headers });
  if (!response.ok) throw await errorFrom(response);
  return response;
}

// WebSocket URL and subprotocols: browsers cannot set headers, so the key (the API key, or
// on /v1/realtime a client secret) goes in the `openai-insecure-api-key.<key>` subprotocol
// (with `realtime`, which the server echoes).
export function openSocket(path, params, key = apiKey()) {
  const url = new URL(path, location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  for (const [name, value] of Object.entries(params)) url.searchParams.set(name, value);
  const protocols = key ? ["realtime", `openai-insecure-api-key.${key}`] : [];
  return new WebSocket(url, protocols);
}
