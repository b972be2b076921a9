// The status bar (from /health), the language lists and the API key panel.

import { apiFetch, apiKey, onUnauthorized, setApiKey } from "./api.js";
import { $, showError } from "./util.js";

export async function refreshHealth() {
  const dot = $("status-dot");
  try {
    const response = await fetch("/health");
    const h = await response.json();
    const state = h.model_loaded ? "loaded" : h.model_state || "not loaded";
    $("status-text").textContent =
      `${h.model_id} · ${h.engine} on ${h.device} · model ${state} · queue ${h.queue_depth}`;
    dot.className = `dot ${h.last_load_error ? "bad" : h.model_loaded ? "ok" : "warn"}`;
  } catch {
    $("status-text").textContent = "Server unreachable";
    dot.className = "dot bad";
  }
}

export async function loadLanguages() {
  let languages = [];
  try {
    languages = (await (await fetch("/ui/languages.json")).json()).languages;
  } catch {
    /* auto only */
  }
  for (const select of document.querySelectorAll("select.language")) {
    select.add(new Option("Auto-detect", "auto"));
    for (const { code, name } of languages) select.add(new Option(name, code));
  }
}

export function setupKeyPanel() {
  const panel = $("key-panel");
  const input = $("api-key");
  const ask = (message) => {
    panel.hidden = false;
    showError($("key-error"), apiKey() ? message : "");
    input.focus();
  };
  onUnauthorized(ask);
  $("key-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    setApiKey(input.value.trim());
    input.value = "";
    await checkKey();
  });
  $("key-clear").addEventListener("click", () => {
    setApiKey("");
    ask("");
  });
  return checkKey();
}

// /v1/models needs the key when the server has one: a 401 shows the panel.
async function checkKey() {
  try {
    await apiFetch("/v1/models");
    $("key-panel").hidden = true;
    showError($("key-error"), "");
  } catch {
    /* the 401 listener shows the panel */
  }
}
