"""Search stage: ``SearchResult`` (what every search returns), BM25, MaxSim multi-vector, sparse and hybrid search,
adaptive K; dense sharded search lives in ``embedlib.index``."""
