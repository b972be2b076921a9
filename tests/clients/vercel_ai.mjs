// The Vercel AI SDK's transcribe() against a running server; prints one JSON object.
//   node vercel_ai.mjs        BASE_URL, API_KEY, AUDIO (a wav file)
import fs from 'node:fs';
import { experimental_transcribe as transcribe } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';

const openai = createOpenAI({ baseURL: process.env.BASE_URL, apiKey: process.env.API_KEY });
const audio = fs.readFileSync(process.env.AUDIO);
const pick = (r) => ({ text: r.text, language: r.language ?? null, durationInSeconds: r.durationInSeconds ?? null, segments: r.segments });
try {
  const plain = await transcribe({ model: openai.transcription('whisper-1'), audio });
  const withOptions = await transcribe({
    model: openai.transcription('whisper-1'),
    audio,
    providerOptions: { openai: { timestampGranularities: ['word'], language: 'en', temperature: 0 } },
  });
  console.log(JSON.stringify({ plain: pick(plain), with_options: pick(withOptions) }));
} catch (err) {
  console.log(JSON.stringify({ error: String(err?.message ?? err), cause: String(err?.cause?.message ?? '') }));
  process.exitCode = 1;
}
