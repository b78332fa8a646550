"""Internal: pure parsers of the text the sources read: no I/O here."""
