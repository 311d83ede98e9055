"""The Triton sampling kernel (``plugins/triton_ops/sampling.py``) against an exact
float64 restricted distribution computed here, and against ``draw()`` of the core sampler.

Without a GPU the kernel runs under Triton's interpreter (``TRITON_INTERPRET=1`` on CPU
tensors). The interpreter is slow (tens of milliseconds a row), so vocabularies are small and
the statistical tests take many draws per row (``u`` [B, S]) over a few rows.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

triton = pytest.importorskip("triton")
from host.core.worker.sampler import draw  # noqa: E402
from host.plugins.triton_ops import sampling as ts  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.triton

ALPHA_Z = 3.090232  # standard normal quantile at 1 - 0.001


def params(B, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, k_dtype=torch.int64):
    """Per-row parameter tensors (scalars broadcast, lists taken as they are)."""
    def col(v, dtype):
        return torch.tensor(v if isinstance(v, list) else [v] * B, dtype=dtype)

    return col(temperature, torch.float32), col(top_k, k_dtype), col(top_p, torch.float32), col(min_p, torch.float32)


def run(logits, t, k, p, mp, u, **kw):
    to = lambda x: x.to(DEV)  # noqa: E731
    return ts.sample(to(logits), to(t), to(k), to(p), to(mp), to(u), **kw).cpu()


def expected_probs(row, t, k, p, mp):
    """The exact distribution of one row, float64, by the definitions: softmax(row / t), min-p
    on it, then the k best, then the smallest best-first prefix of the renormalised rest
    holding top_p (a token stays while the mass before it is below top_p)."""
    s = row.double() / t
    probs = torch.softmax(s, dim=0)
    keep = probs > 0
    if mp > 0:
        keep &= probs >= mp * probs.max()
    order = s.argsort(descending=True)
    if k > 0:
        keep[order[k:]] = False
    if p < 1:
        q = torch.where(keep, probs, 0.0)
        q = (q / q.sum())[order]
        before = q.cumsum(0) - q
        keep[order[before >= p]] = False
    w = torch.where(keep, probs, 0.0)
    return w / w.sum()


def chi2(counts, probs):
    """(statistic, critical value at p = 0.001): Pearson's chi-square of ``counts`` against
    ``probs``, categories with an expected count under 5 pooled; the critical value by the
    Wilson-Hilferty approximation. A count where ``probs`` is 0 gives an infinite statistic."""
    counts, probs = counts.double(), probs.double()
    n = counts.sum()
    if bool((counts[probs == 0] > 0).any()):
        return math.inf, 0.0
    exp = probs * n
    big = exp >= 5
    obs_b, exp_b = counts[big].tolist(), exp[big].tolist()
    rest_o, rest_e = float(counts[~big & (probs > 0)].sum()), float(exp[~big & (probs > 0)].sum())
    if rest_e > 0:
        obs_b.append(rest_o)
        exp_b.append(rest_e)
    stat = sum((o - e) ** 2 / e for o, e in zip(obs_b, exp_b, strict=True))
    df = len(exp_b) - 1
    if df == 0:  # one category holds all the mass (and all the counts, checked above)
        return 0.0, 1.0
    crit = df * (1 - 2 / (9 * df) + ALPHA_Z * math.sqrt(2 / (9 * df))) ** 3
    return stat, crit


def test_chi2_helper_critical_values():
    # the approximation against tabulated chi-square quantiles at 0.999 (within 2%; at small df
    # it errs high, i.e. towards accepting)
    for df, table in [(5, 20.515), (10, 29.588), (30, 59.703), (60, 99.607)]:
        crit = df * (1 - 2 / (9 * df) + ALPHA_Z * math.sqrt(2 / (9 * df))) ** 3
        assert abs(crit - table) / table < 0.02


CASES = {
    "temperature": dict(temperature=0.7),
    "top_k": dict(temperature=1.0, top_k=10),
    "top_p": dict(temperature=0.9, top_p=0.8),
    "min_p": dict(temperature=1.3, min_p=0.1),
    "top_k_top_p": dict(temperature=0.8, top_k=12, top_p=0.7),
    "all_three": dict(temperature=1.5, top_k=20, top_p=0.9, min_p=0.2),
}
ROWS, DRAWS, VOCAB = 8, 500, 64


@pytest.fixture(scope="module")
def chi_logits():
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(11))


@pytest.fixture(scope="module")
def counts(chi_logits):
    """Kernel token counts per case: ROWS rows of the same logits, DRAWS uniforms each."""
    out = {}
    for i, (name, case) in enumerate(CASES.items()):
        u = torch.rand(ROWS, DRAWS, dtype=torch.float64, generator=torch.Generator().manual_seed(100 + i))
        tokens = run(chi_logits.expand(ROWS, VOCAB).contiguous(), *params(ROWS, **case), u)
        out[name] = torch.bincount(tokens.flatten(), minlength=VOCAB)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_distribution_chi2(name, chi_logits, counts):
    c = CASES[name]
    probs = expected_probs(chi_logits, c["temperature"], c.get("top_k", 0), c.get("top_p", 1.0), c.get("min_p", 0.0))
    stat, crit = chi2(counts[name], probs)
    assert stat < crit, (name, stat, crit)


def test_chi2_rejects_a_wrong_distribution(chi_logits, counts):
    """The same counts fail against the distribution a wrong kernel would have drawn from."""
    unrestricted = expected_probs(chi_logits, 1.0, 0, 1.0, 0.0)
    stat, crit = chi2(counts["top_k"], unrestricted)  # restriction forgotten
    assert stat > crit
    stat, crit = chi2(counts["top_p"], expected_probs(chi_logits, 0.9, 0, 1.0, 0.0))
    assert stat > crit
    stat, crit = chi2(counts["temperature"], expected_probs(chi_logits, 0.85, 0, 1.0, 0.0))  # wrong T
    assert stat > crit
    # top-p of the whole distribution instead of the top-k one
    stat, crit = chi2(counts["top_k_top_p"], expected_probs(chi_logits, 0.8, 0, 0.7, 0.0))
    assert stat > crit
    stat, crit = chi2(counts["all_three"], expected_probs(chi_logits, 1.5, 20, 0.9, 0.0))  # min-p forgotten
    assert stat > crit


@pytest.mark.parametrize("name", list(CASES))
def test_expected_distribution_is_the_core_samplers(name, chi_logits):
    """The distribution the kernel is held to is ``draw()``'s: its counts pass the same test."""
    c = CASES[name]
    n = 6000
    t, k, p, mp = params(n, **c)
    torch.manual_seed(7)
    tokens = draw(chi_logits.expand(n, VOCAB).contiguous(), t, mp, k, p, {})
    probs = expected_probs(chi_logits, c["temperature"], c.get("top_k", 0), c.get("top_p", 1.0), c.get("min_p", 0.0))
    stat, crit = chi2(torch.bincount(tokens, minlength=VOCAB), probs)
    assert stat < crit, (name, stat, crit)


# -- exact cases ---------------------------------------------------------------------------------


def test_degenerate_rows_exact():
    g = torch.Generator().manual_seed(1)
    B, V = 6, 150
    logits = torch.randn(B, V, generator=g) * 3
    u = torch.rand(B, 4, dtype=torch.float64, generator=g)
    u[:, 0], u[:, 1] = 0.0, 1.0 - 1e-12  # the ends of [0, 1); 1 - 1e-12 rounds to 1 in float32
    best = logits.argmax(dim=-1, keepdim=True).expand(B, 4)
    temps = [0.5, 1.0, 2.0, 0.7, 1.0, 3.0]
    assert torch.equal(run(logits, *params(B, temperature=temps, top_k=1), u), best)
    assert torch.equal(run(logits, *params(B, temperature=temps, min_p=0.999), u), best)
    assert torch.equal(run(logits, *params(B, temperature=temps, top_p=1e-6), u), best)
    assert torch.equal(run(logits, *params(B, temperature=temps, top_p=0.0), u), best)
    # greedy rows (temperature < 1e-5): the argmax whatever the other parameters and u say
    assert torch.equal(run(logits, *params(B, temperature=0.0, top_k=5, top_p=0.5, min_p=0.1), u), best)


def test_greedy_ties_take_the_first_index():
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    u = torch.tensor([[0.0, 0.5, 0.99]] * 2, dtype=torch.float64)
    got = run(logits, *params(2, temperature=0.0), u)
    assert got.tolist() == [[1, 1, 1], [0, 0, 0]]


def test_single_finite_token_and_masked_tokens():
    g = torch.Generator().manual_seed(2)
    V = 90
    logits = torch.full((4, V), float("-inf"))
    logits[0, 37] = 1.5
    logits[1, 0] = -40.0
    logits[2, V - 1] = 0.0
    logits[3, 5] = 2.0
    u = torch.rand(4, 16, dtype=torch.float64, generator=g)
    u[:, 0], u[:, 1] = 0.0, 1.0 - 1e-12
    for case in [dict(), dict(top_k=3), dict(top_k=1000), dict(top_p=0.5), dict(min_p=0.3), dict(top_k=2, top_p=0.9, min_p=0.5)]:
        got = run(logits, *params(4, temperature=0.8, **case), u)
        assert (got == torch.tensor([37, 0, V - 1, 5])[:, None]).all(), case
    # grammar-style masks: masked tokens are never drawn, whatever the parameters
    logits = torch.randn(3, V, generator=g) * 2
    allowed = torch.rand(3, V, generator=g) < 0.2
    logits = logits.masked_fill(~allowed, float("-inf"))
    u = torch.rand(3, 64, dtype=torch.float64, generator=g)
    got = run(logits, *params(3, temperature=[0.5, 1.0, 2.0], top_k=[0, 5, 200], top_p=[1.0, 0.95, 0.5]), u)
    assert allowed.gather(1, got).all()


def test_all_masked_row_returns_token_zero():
    logits = torch.full((2, 40), float("-inf"))
    logits[1, 7] = 0.0
    got = run(logits, *params(2, top_k=4, top_p=0.9), torch.tensor([0.3, 0.3], dtype=torch.float64))
    assert got.tolist() == [0, 7]


def test_ties_at_a_threshold_are_kept():
    # k = 2 with the 2nd-best value three times: all three stay (draw() keeps one of them)
    logits = torch.tensor([[5.0, 4.0, 4.0, 1.0, 4.0, 0.0] + [-3.0] * 10])
    u = torch.linspace(0, 1, 400, dtype=torch.float64)[None, :-1]
    reached = set(run(logits, *params(1, top_k=2), u).flatten().tolist())
    assert reached == {0, 1, 2, 4}
    # top-p: the nucleus ends inside a tie, so all the tied tokens stay
    logits = torch.tensor([[2.0, 1.0, 1.0, 1.0, -2.0, -2.0]])
    reached = set(run(logits, *params(1, top_p=0.6), u).flatten().tolist())
    assert reached == {0, 1, 2, 3}
    assert set(ts.sample_ref(logits, *params(1, top_p=0.6), u).flatten().tolist()) == {0, 1, 2, 3}


def test_top_k_at_or_over_the_vocabulary_is_off():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 50, generator=g)
    u = torch.rand(2, 300, dtype=torch.float64, generator=g)
    off = run(logits, *params(2), u)
    assert torch.equal(run(logits, *params(2, top_k=[50, 10**6]), u), off)
    assert torch.equal(run(logits, *params(2, top_k=[-1, 0], k_dtype=torch.int32), u), off)


def test_one_dimensional_u_matches_one_draw_per_row():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(5, 70, generator=g)
    u = torch.rand(5, dtype=torch.float32, generator=g)
    pr = params(5, temperature=[0.3, 1.0, 1.7, 1.0, 0.9], top_k=[0, 7, 0, 30, 3], top_p=[0.9, 1.0, 0.5, 0.8, 1.0])
    one = run(logits, *pr, u)
    assert one.shape == (5,)
    assert torch.equal(one, run(logits, *pr, u[:, None])[:, 0])


# -- kept sets -------------------------------------------------------------------------------------


def random_rows(B, V, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, V, generator=g) * torch.rand(B, 1, generator=g) * 6).to(dtype)
    logits[B // 2 :] = logits[B // 2 :].masked_fill(torch.rand(B - B // 2, V, generator=g) < 0.3, float("-inf"))
    temps = (torch.rand(B, generator=g) * 1.8 + 0.2).tolist()
    ks = torch.randint(-1, 40, (B,), generator=g).tolist()
    ps = torch.where(torch.rand(B, generator=g) < 0.3, 1.0, torch.rand(B, generator=g) * 0.95 + 0.02).tolist()
    mps = torch.where(torch.rand(B, generator=g) < 0.5, 0.0, torch.rand(B, generator=g) * 0.3).tolist()
    return logits, params(B, temperature=temps, top_k=ks, top_p=ps, min_p=mps)


@pytest.mark.parametrize(
    "dtype,block",
    [(torch.float32, None), (torch.float32, 32), (torch.bfloat16, 64), (torch.float16, None)],
)
def test_kept_set_matches_reference(dtype, block):
    """Every token the kernel draws is in the exact kept set, every token with a mass above
    the grid step is drawn, and the reference's kept set is the exact one (bfloat16 rows have
    many ties; the kernel and the reference both keep whole ties)."""
    B, V, S = 12, 100, 256
    logits, pr = random_rows(B, V, seed=20 + (block or 0), dtype=dtype)
    u = ((torch.arange(S, dtype=torch.float64) + 0.5) / S).expand(B, S)  # a grid of uniforms
    got = run(logits, *pr, u, block=block)
    ref = ts.sample_ref(logits, *pr, u)
    kept = ts.kept_mask_ref(logits, *pr)
    probs = ts.probs_ref(logits, *pr)
    for r in range(B):
        t, k, p, mp = (x[r].item() for x in pr)
        exact = expected_probs(logits[r].float(), t, int(k), p, mp)
        if dtype == torch.float32:  # no ties: the definitions give the kept set
            assert torch.equal(kept[r], exact > 0), r
            torch.testing.assert_close(probs[r], exact, rtol=1e-9, atol=1e-12)
        must = set(torch.nonzero(probs[r] > 1.5 / S).flatten().tolist())
        may = set(torch.nonzero(kept[r]).flatten().tolist())
        for name, tokens in (("kernel", got[r]), ("reference", ref[r])):
            reached = set(tokens.tolist())
            assert must <= reached <= may, (name, r, sorted(must - reached), sorted(reached - may))


def test_mixed_rows_each_match_their_own_distribution():
    """One batch, different logits and parameters per row (greedy included): each row's draws
    against its own exact distribution."""
    V, S = 48, 600
    g = torch.Generator().manual_seed(30)
    rows = [
        dict(temperature=0.6),
        dict(temperature=1.0, top_k=5),
        dict(temperature=1.2, top_p=0.75),
        dict(temperature=0.9, min_p=0.2),
        dict(temperature=2.0, top_k=15, top_p=0.8),
        dict(temperature=0.0, top_k=3),  # greedy
        dict(temperature=1.1, top_k=8, top_p=0.9, min_p=0.1),
    ]
    B = len(rows)
    logits = torch.randn(B, V, generator=g) * 2
    cols = {key: [r.get(key, d) for r in rows] for key, d in [("temperature", 1.0), ("top_k", 0), ("top_p", 1.0), ("min_p", 0.0)]}
    u = torch.rand(B, S, dtype=torch.float64, generator=g)
    got = run(logits, *params(B, **cols), u, block=16)
    for r, case in enumerate(rows):
        if case["temperature"] == 0.0:
            assert (got[r] == logits[r].argmax()).all()
            continue
        probs = expected_probs(logits[r], case["temperature"], case.get("top_k", 0), case.get("top_p", 1.0), case.get("min_p", 0.0))
        stat, crit = chi2(torch.bincount(got[r], minlength=V), probs)
        assert stat < crit, (r, case, stat, crit)


_COMPILE_SM90 = """
import sys
import triton
try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from host.plugins.triton_ops import sampling as ts
    sig = {
        "logits_ptr": "*bf16", "temp_ptr": "*fp32", "top_k_ptr": "*i32", "top_p_ptr": "*fp32", "min_p_ptr": "*fp32",
        "u_ptr": "*fp64", "out_ptr": "*i64", "stride": "i32", "u_stride": "i32", "V": "i32", "draws": "i32",
        "BLOCK": "constexpr", "PIVOTS": "constexpr", "DRAWS_BLOCK": "constexpr",
    }
    src = ASTSource(fn=ts._sample_kernel, signature=sig, constexprs={"BLOCK": 1024, "PIVOTS": ts._PIVOTS, "DRAWS_BLOCK": 4})
except (ImportError, TypeError) as e:  # another Triton's compiler API
    print("SKIP", triton.__version__, e)
    sys.exit(0)
kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
assert kernel.asm["cubin"]
print("COMPILED")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the other tests compile the kernel")
def test_kernel_compiles_for_sm90():
    """The interpreter accepts programs the compiler rejects (loop-carried types, scalar
    branches): compile the kernel for an H100 without one, as far as a cubin. In a fresh
    process, since this module's Triton runs interpreted."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    res = subprocess.run([sys.executable, "-c", _COMPILE_SM90], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    if res.stdout.startswith("SKIP"):
        pytest.skip(res.stdout.strip())
    assert "COMPILED" in res.stdout
