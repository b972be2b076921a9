// Entry point: wires the page's modules together.

import { setupLive } from "./live.js";
import { loadLanguages, refreshHealth, setupKeyPanel } from "./status.js";
import { setupUpload } from "./upload.js";

setupUpload();
setupLive();
await loadLanguages();
await setupKeyPanel();
await refreshHealth();
setInterval(refreshHealth, 5000);
document.body.dataset.ready = "true";
