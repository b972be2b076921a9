"""The upload pipeline: cut, schedule and merge (the service), long form, decoding options,
word times."""
