"""The command line: the parser, `serve`, `transcribe` (local or --server), `check`,
`download`."""
