"""The training objectives against hand-computed examples (pplx-embed §4.2-§4.6)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from embedlib.objectives import (
    all_gather_with_grad,
    contextual_beta,
    diffusion_loss,
    embed_int8,
    info_nce,
    mask_for_diffusion,
    matryoshka,
    pair_loss,
    triplet_loss,
)
from embedlib.objectives.contrastive import contextual_local


def nce(positive: float, negatives: list[float], tau: float) -> float:
    """-log softmax of the positive, written out term by term."""
    numerator = math.exp(positive / tau)
    return -math.log(numerator / (numerator + sum(math.exp(s / tau) for s in negatives)))


def unit(*xs: float) -> list[float]:
    norm = math.sqrt(sum(x * x for x in xs))
    return [x / norm for x in xs]


# q1 = e1, q2 = e2; d1 is close to q2 (cos 0.95 > s(q2, d2) + 0.1), so for q2 it is a false negative.
Q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
D = torch.tensor([unit(math.sqrt(1 - 0.95**2), 0.95), [0.6, 0.8]])


def test_info_nce_matches_formula_and_drops_masked_terms():
    positive, negatives = torch.tensor([0.5]), torch.tensor([[0.2, 0.9]])
    assert info_nce(positive, negatives, None, 0.1).item() == pytest.approx(
        nce(0.5, [0.2, 0.9], 0.1), rel=1e-5
    )
    keep = torch.tensor([[True, False]])
    assert info_nce(positive, negatives, keep, 0.1).item() == pytest.approx(nce(0.5, [0.2], 0.1), rel=1e-5)


def test_pair_loss_false_negative_mask_removes_near_duplicates():
    s11, s12 = math.sqrt(1 - 0.95**2), 0.6  # s(q1, d1), s(q1, d2)
    s21, s22 = 0.95, 0.8  # s(q2, d1), s(q2, d2)
    tau = 0.5
    # q1: d2 (0.6 > 0.312 + 0.1) is masked; the other query q2 (cos 0) stays.
    # q2: d1 (0.95 > 0.8 + 0.1) is masked; q1 (cos 0) stays.
    expected = (nce(s11, [0.0], tau) + nce(s22, [0.0], tau)) / 2
    assert pair_loss(Q, D, tau).item() == pytest.approx(expected, rel=1e-4)
    unmasked = (nce(s11, [s12, 0.0], tau) + nce(s22, [s21, 0.0], tau)) / 2
    assert pair_loss(Q, D, tau, margin=None).item() == pytest.approx(unmasked, rel=1e-4)
    assert unmasked > expected


def test_pair_loss_duplicate_document_mask():
    tau = 0.5
    s11, s12, s21, s22 = math.sqrt(1 - 0.95**2), 0.6, 0.95, 0.8
    same = torch.tensor([7, 7])  # both positives are the same document: never each other's negatives
    assert pair_loss(Q, D, tau, margin=None, doc_hashes=same).item() == pytest.approx(
        (nce(s11, [0.0], tau) + nce(s22, [0.0], tau)) / 2, rel=1e-4
    )
    different = torch.tensor([1, 2])
    assert pair_loss(Q, D, tau, margin=None, doc_hashes=different).item() == pytest.approx(
        (nce(s11, [s12, 0.0], tau) + nce(s22, [s21, 0.0], tau)) / 2, rel=1e-4
    )


def test_triplet_loss_uses_in_batch_documents_and_hard_negatives():
    tau = 0.5
    hard = torch.tensor([[[1.0, 1.0], [-1.0, 0.0]], [[0.0, -1.0], [1.0, 0.0]]])  # (B=2, K=2, d)
    c = 1 / math.sqrt(2)
    expected = (nce(math.sqrt(1 - 0.95**2), [0.6, c, -1.0], tau) + nce(0.8, [0.95, -1.0, 0.0], tau)) / 2
    assert triplet_loss(Q, D, hard, tau).item() == pytest.approx(expected, rel=1e-4)


def test_contextual_local_terms_and_padding_chunks():
    tau, alpha = 0.5, 0.2
    q = torch.tensor([[1.0, 0.0]])
    chunks = torch.tensor([[[0.8, 0.6], [1.0, 0.0], [0.0, 1.0], [5.0, 0.0]]])  # last chunk is padding
    valid = torch.tensor([[True, True, True, False]])
    gold = torch.tensor([1])
    # L_seq and L_batch coincide with one document: the gold chunk (cos 1) against chunks 0 and 2.
    expected = alpha * nce(1.0, [0.8, 0.0], tau) + (1 - alpha) * nce(1.0, [0.8, 0.0], tau)
    assert contextual_local(q, chunks, valid, gold, tau, alpha).item() == pytest.approx(expected, rel=1e-4)


def test_contextual_beta_cosine_schedule():
    assert contextual_beta(0.0) == pytest.approx(0.2)
    assert contextual_beta(0.5) == pytest.approx(0.35)
    assert contextual_beta(1.0) == pytest.approx(0.5)
    assert contextual_beta(0.25) < 0.35 - 0.075  # slow start of a half cosine


def test_int8_embeddings_and_matryoshka_sum():
    pooled = torch.randn(4, 16, requires_grad=True)
    codes = embed_int8(pooled, 8)
    assert codes.shape == (4, 8)
    assert torch.equal(codes, codes.round()) and codes.abs().max() <= 127
    codes.sum().backward()
    assert (pooled.grad[:, :8] > 0).all() and (pooled.grad[:, 8:] == 0).all()  # STE: tanh's gradient
    q, d = torch.randn(4, 16), torch.randn(4, 16)
    total = matryoshka(lambda a, b: pair_loss(a, b), [q, d], [4, 8, None])
    parts = sum(pair_loss(embed_int8(q, dim), embed_int8(d, dim)) for dim in (4, 8, None))
    assert total.item() == pytest.approx(parts.item(), rel=1e-6)


def test_diffusion_loss_by_hand():
    vocab = 5
    logits = torch.randn(1, 4, vocab)
    targets = torch.tensor([[1, 2, 3, 0]])
    masked = torch.tensor([[True, False, True, False]])
    attention = torch.tensor([[1, 1, 1, 0]])  # 3 real tokens
    t = torch.tensor([0.25])
    ce = F.cross_entropy(logits[0], targets[0], reduction="none")
    expected = (ce[0] + ce[2]) / 0.25 / 3
    loss, accuracy = diffusion_loss(logits, targets, masked, t, attention)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    hits = sum(int(logits[0, i].argmax() == targets[0, i]) for i in (0, 2))
    assert accuracy.item() == pytest.approx(hits / 2)


def test_diffusion_masking_rate_follows_t_and_spares_padding():
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 100, (256, 200))
    attention = torch.ones_like(ids)
    attention[:, 150:] = 0
    noisy, masked, t = mask_for_diffusion(ids, attention, mask_id=3, generator=generator)
    assert (t >= 0.001).all() and (t <= 1).all()
    assert not masked[:, 150:].any()
    assert torch.equal(noisy[masked], torch.full_like(noisy[masked], 3))
    assert torch.equal(noisy[~masked], ids[~masked])
    rate = masked[:, :150].float().mean(dim=1)
    assert torch.corrcoef(torch.stack([rate, t]))[0, 1] > 0.95


def _gather_worker(rank: int, world: int, port: int, queue) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    local = torch.full((2, 3), float(rank + 1), requires_grad=True)
    gathered = all_gather_with_grad(local)
    (gathered * torch.arange(1.0, 5.0).unsqueeze(1)).sum().backward()
    queue.put((rank, gathered.detach().tolist(), local.grad.tolist()))
    dist.destroy_process_group()


def test_all_gather_with_grad_two_processes():
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    context = mp.get_context("spawn")
    queue = context.Queue()
    procs = [context.Process(target=_gather_worker, args=(r, 2, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict((r, (g, grad)) for r, g, grad in (queue.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(timeout=60)
    for rank in (0, 1):
        gathered, grad = results[rank]
        assert gathered == [[1.0] * 3] * 2 + [[2.0] * 3] * 2  # rank order
        rows = [1.0, 2.0] if rank == 0 else [3.0, 4.0]  # the weights of this rank's own rows
        assert grad == [[rows[0]] * 3, [rows[1]] * 3]
