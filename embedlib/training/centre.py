"""A saved model's binary centre: the mean float embedding of sample training documents, written beside the
weights (``binary_centre.json``) so that binary codes are ``sign(x - centre)``. Training fits one after saving
(``binary_centre_docs``), and so does a merge (``jobs/merge.py``): a merged model's weights differ from both ends'."""

from __future__ import annotations

from embedlib import storage


def fit_binary_centre(model_url: str, data_url: str, docs: int, seed: int = 0, data_format: str | None = None) -> None:
    """Fit the centre of the model saved at ``model_url`` on up to ``docs`` positives of the pair/triplet rows at
    ``data_url`` (drawn at random with ``seed``) and save it with the model."""
    from embedlib.encoding.encoder import Encoder
    from embedlib.models.loading import BINARY_CENTRE_FILE
    from embedlib.training.data import sample_documents

    texts = sample_documents(data_url, docs, seed, data_format)
    encoder = Encoder.from_pretrained(model_url)
    contents = encoder.binary_centre_file(texts, {"data": storage.redact_url(data_url), "seed": seed})
    storage.write_bytes_atomic(storage.join(model_url, BINARY_CENTRE_FILE), contents.encode())
