"""What a transcript becomes: response bodies, subtitles, translation, speakers."""
