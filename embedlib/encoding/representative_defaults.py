"""DiffRetriever's published setting, torch-free so that configs (index and evaluation) can name it."""

DEFAULT_K_QUERY = 4  # mask tokens per query
DEFAULT_K_PASSAGE = 16  # mask tokens (vectors) per document
DEFAULT_TOP_TERMS = 128  # terms kept per sparse vector
