"""Internal: the pages' static files (HTML, JavaScript, CSS), served by ``collector.api.pages``."""
