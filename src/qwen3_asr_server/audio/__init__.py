"""Audio in: decoding uploads, PCM and G.711, voice detection, the decoded-audio budget,
pause compaction, and cutting at pauses."""
