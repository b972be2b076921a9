// The OpenAI Node SDK against a running server; prints one JSON object with what it got.
//   node openai_node.mjs http              BASE_URL, API_KEY, AUDIO (a wav file)
//   node openai_node.mjs realtime-ws       BASE_URL (https), API_KEY, PCM (24 kHz s16le)
//   node --experimental-websocket openai_node.mjs realtime-browser   (same)
import fs from 'node:fs';
import OpenAI, { toFile } from 'openai';
import { OpenAIRealtimeWS } from 'openai/realtime/ws';
import { OpenAIRealtimeWebSocket } from 'openai/realtime/websocket';

const client = new OpenAI({ baseURL: process.env.BASE_URL, apiKey: process.env.API_KEY });
const mode = process.argv[2];

async function http() {
  const audio = fs.readFileSync(process.env.AUDIO);
  const file = () => toFile(audio, 'speech.wav', { type: 'audio/wav' });
  const out = {};
  for (const format of ['json', 'text', 'srt', 'vtt', 'verbose_json']) {
    out[format] = await client.audio.transcriptions.create({
      file: await file(), model: 'whisper-1', response_format: format,
    });
  }
  const stream = await client.audio.transcriptions.create({
    file: await file(), model: 'whisper-1', stream: true,
  });
  out.stream = [];
  for await (const event of stream) out.stream.push(event);
  return out;
}

function realtime(Client) {
  const pcm = fs.readFileSync(process.env.PCM);
  const rt = new Client({ model: 'gpt-4o-transcribe' }, client);
  const events = [];
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('timed out: ' + JSON.stringify(events))), 60000);
    rt.on('error', (err) => { clearTimeout(timer); reject(err); });
    rt.on('event', (event) => {
      events.push(event);
      if (event.type === 'session.created') {
        rt.send({
          type: 'session.update',
          session: {
            type: 'transcription',
            audio: { input: { format: { type: 'audio/pcm', rate: 24000 }, turn_detection: null } },
          },
        });
        for (let i = 0; i < pcm.length; i += 48000) {
          rt.send({ type: 'input_audio_buffer.append', audio: pcm.subarray(i, i + 48000).toString('base64') });
        }
        rt.send({ type: 'input_audio_buffer.commit' });
      }
      if (event.type === 'conversation.item.input_audio_transcription.completed') {
        clearTimeout(timer);
        rt.close();
        resolve({ events, protocol: rt.socket.protocol ?? null });
      }
    });
  });
}

const run = { http, 'realtime-ws': () => realtime(OpenAIRealtimeWS), 'realtime-browser': () => realtime(OpenAIRealtimeWebSocket) }[mode];
try {
  console.log(JSON.stringify(await run()));
} catch (err) {
  console.log(JSON.stringify({ error: String(err?.message ?? err), status: err?.status ?? null }));
  process.exitCode = 1;
}
