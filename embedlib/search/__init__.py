"""Search stage: lexical (BM25) retrieval and score fusion; dense sharded search lives in ``embedlib.index``."""
