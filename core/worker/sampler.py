"""Token sampling over the whole batch with tensor operations.

The :class:`Sampler` is stateless: everything about the batch arrives in a
:class:`SamplingMetadata` built by the model runner each step. The chain, in order (order is
semantics: a wrong order never crashes, it silently changes the distribution):

1. raw logprobs snapshot (``log_softmax`` of the float32 logits) when any row wants logprobs;
2. float32;
3. logits processors: structured-output bitmask and allowed-token whitelist, bad words,
   ``min_tokens`` (EOS / stop ids masked) and ``logit_bias`` — these change the argmax, so they
   run before greedy — then repetition / frequency / presence penalties;
4. greedy rows (temperature < 1e-5) take the argmax; the others divide by temperature, drop
   tokens under ``min_p`` times the top probability, keep the ``top_k`` best, keep the
   ``top_p`` nucleus (of the top-k distribution when both are set), and draw.

The draw is inverse-CDF sampling: one uniform number per row, from the request's own
``torch.Generator`` when it has a seed, so a seeded request's tokens do not depend on what
else is in the batch. Top-k / top-p work on a small candidate set from ``torch.topk`` instead
of sorting the whole vocabulary (a nucleus that does not fit in the candidates falls back to a
full sort for that row only).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from host.contracts.messages import TokenLogprobs

_GREEDY_EPS = 1e-5
_TOP_P_CANDIDATES = 1024  # candidate set tried first for top-p rows without a top-k


@dataclass
class SamplingMetadata:
    """Per-step sampling inputs for a batch of ``B`` rows (one row per request).

    Optional tensors are ``None`` when no row uses the feature, so the common cases cost
    nothing. ``generators`` maps a row to its request's generator (seeded requests only);
    rows not in it draw from torch's default generator.
    """

    temperature: torch.Tensor  # float32 [B]; < 1e-5 means greedy
    all_greedy: bool
    all_random: bool
    top_k: torch.Tensor | None = None  # int64 [B], 0 = off
    top_p: torch.Tensor | None = None  # float32 [B], 1 = off
    min_p: torch.Tensor | None = None  # float32 [B], 0 = off
    generators: dict[int, torch.Generator] = field(default_factory=dict)
    max_num_logprobs: int | None = None  # None: no row wants logprobs; -1: whole vocabulary
    # logits processors (applied to the rows named)
    allowed_mask: torch.Tensor | None = None  # bool [B, V], True = may be sampled
    banned: tuple[torch.Tensor, torch.Tensor] | None = None  # (rows, token ids) set to -inf
    logit_bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # (rows, ids, values)
    presence_penalty: torch.Tensor | None = None  # float32 [B]
    frequency_penalty: torch.Tensor | None = None  # float32 [B]
    repetition_penalty: torch.Tensor | None = None  # float32 [B]
    output_token_ids: list[list[int]] | None = None  # per row, for penalties
    prompt_token_ids: list[list[int]] | None = None  # per row, for the repetition penalty

    def to(self, device: torch.device) -> "SamplingMetadata":
        """A copy with every tensor on ``device`` (asynchronous copies; generators stay on the
        host: the uniforms they draw are copied instead)."""

        def move(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                return x.to(device, non_blocking=True)
            if isinstance(x, tuple):
                return tuple(move(t) for t in x)
            return x

        return dataclasses.replace(self, **{f.name: move(getattr(self, f.name)) for f in dataclasses.fields(self)})


@dataclass
class LogprobsTensors:
    """Logprobs of one token per row: column 0 is the sampled (or given) token, columns 1..k
    the top-k tokens; ``ranks`` is the sampled token's rank (1 = most likely)."""

    token_ids: torch.Tensor  # int64 [B, 1 + k]
    logprobs: torch.Tensor  # float32 [B, 1 + k]
    ranks: torch.Tensor  # int64 [B]

    def row(self, row: int, k: int) -> "TokenLogprobs":
        """Row ``row`` as the wire's :class:`TokenLogprobs`, with ``k`` top tokens (``-1``: all
        the columns there are)."""
        from host.contracts.messages import TokenLogprobs

        width = self.token_ids.shape[1] if k == -1 else 1 + k
        return TokenLogprobs(
            token_ids=self.token_ids[row, :width].tolist(),
            logprobs=self.logprobs[row, :width].tolist(),
            rank=int(self.ranks[row]),
        )


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # int64 [B]
    logprobs: LogprobsTensors | None = None


class Sampler:
    """Picks one token per row of ``logits``; see the module docstring for the chain.

    ``draw_kernel`` is an optional device kernel with the signature of
    ``host.plugins.triton_ops.sampling.sample`` (logits, temperature, top_k, top_p,
    min_p, uniforms -> token ids) that a platform supplies: with it, rows that are not greedy
    are drawn on the device with no host synchronisation (the greedy rows take the argmax in
    the same launch). Without it the torch path below runs on any device.

    The kernel draws from the same distribution as :func:`draw` but walks the kept tokens in
    vocabulary order, so a seeded request gets different (equally distributed) tokens with
    and without it; with it, seeded results reproduce on the same platform and settings."""

    def __init__(self, draw_kernel: Any = None) -> None:
        self.draw_kernel = draw_kernel

    def __call__(self, logits: torch.Tensor, md: SamplingMetadata) -> SamplerOutput:
        if logits.device.type != "cpu":
            md = md.to(logits.device)
        logits = logits.float()
        raw_logprobs = logits.log_softmax(dim=-1) if md.max_num_logprobs is not None else None
        logits = apply_logits_processors(logits, md)
        sampled = self.sample(logits, md)
        logprobs = None
        if raw_logprobs is not None:
            logprobs = gather_logprobs(raw_logprobs, md.max_num_logprobs, sampled)
        return SamplerOutput(sampled, logprobs)

    def sample(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        if md.all_greedy:
            return logits.argmax(dim=-1)
        temperature = md.temperature.to(logits.device)
        if self.draw_kernel is not None:
            return self._sample_with_kernel(logits, md, temperature)
        is_greedy = temperature < _GREEDY_EPS
        dev = logits.device
        out = torch.empty(logits.shape[0], dtype=torch.int64, device=dev)
        rows = torch.arange(logits.shape[0], device=dev) if md.all_random else torch.nonzero(~is_greedy).squeeze(1)
        if not md.all_random:
            greedy_rows = torch.nonzero(is_greedy).squeeze(1)
            out[greedy_rows] = logits.index_select(0, greedy_rows).argmax(dim=-1)
        sub = logits if md.all_random else logits.index_select(0, rows)
        pick = lambda t: None if t is None else (t if md.all_random else t.index_select(0, rows))  # noqa: E731
        gens = md.generators if md.all_random else _remap(md.generators, rows)
        out[rows] = draw(sub, temperature if md.all_random else temperature[rows], pick(md.min_p), pick(md.top_k), pick(md.top_p), gens)
        return out

    def _sample_with_kernel(self, logits: torch.Tensor, md: SamplingMetadata, temperature: torch.Tensor) -> torch.Tensor:
        """Every row through the device kernel, greedy rows included (it takes their argmax):
        one launch whatever the batch mix, and nothing read back."""
        batch, dev = logits.shape[0], logits.device
        k = md.top_k if md.top_k is not None else torch.zeros(batch, dtype=torch.int64, device=dev)
        p = md.top_p if md.top_p is not None else torch.ones(batch, device=dev)
        mp = md.min_p if md.min_p is not None else torch.zeros(batch, device=dev)
        if md.generators:
            u = _uniforms(batch, md.generators).to(dev, non_blocking=True)
        else:
            u = torch.rand(batch, dtype=torch.float64, device=dev)
        return self.draw_kernel(logits, temperature, k, p, mp, u)


def _remap(generators: dict[int, torch.Generator], rows: torch.Tensor) -> dict[int, torch.Generator]:
    """Generators keyed by position in ``rows`` instead of batch row."""
    if not generators:
        return {}
    return {j: generators[r] for j, r in enumerate(rows.tolist()) if r in generators}


# -- logits processors --------------------------------------------------------------------------


def apply_logits_processors(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """Steps that change the argmax (whitelist, bad words, min_tokens, bias) and penalties."""
    if md.allowed_mask is not None:
        logits = logits.masked_fill(~md.allowed_mask, float("-inf"))
    if md.banned is not None:
        rows, ids = md.banned
        logits = logits.index_put((rows, ids), torch.tensor(float("-inf"), device=logits.device))
    if md.logit_bias is not None:
        rows, ids, values = md.logit_bias
        logits = logits.index_put((rows, ids), values, accumulate=True)
    if md.presence_penalty is not None or md.frequency_penalty is not None or md.repetition_penalty is not None:
        logits = apply_penalties(logits, md)
    return logits


def _padded(rows: list[list[int]], pad: int) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), max(width, 1)), pad, dtype=torch.int64)
    for i, r in enumerate(rows):
        if r:
            out[i, : len(r)] = torch.tensor(r, dtype=torch.int64)
    return out


def token_counts(rows: list[list[int]], vocab: int) -> torch.Tensor:
    """[len(rows), vocab] int32: how often each token occurs in each row."""
    ids = _padded(rows, vocab)  # pad with an extra column, dropped below
    counts = torch.zeros(len(rows), vocab + 1, dtype=torch.int32)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.int32))
    return counts[:, :vocab]


def apply_penalties(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """Repetition (prompt and output tokens; positive logits divided, negative multiplied),
    then frequency (minus penalty x count in the output) and presence (minus penalty if the
    token occurred in the output) — the OpenAI definitions."""
    vocab = logits.shape[-1]
    assert md.output_token_ids is not None
    out_counts = token_counts(md.output_token_ids, vocab).to(logits.device)
    if md.repetition_penalty is not None:
        assert md.prompt_token_ids is not None
        seen = (token_counts(md.prompt_token_ids, vocab).to(logits.device) > 0) | (out_counts > 0)
        rp = md.repetition_penalty[:, None]
        penalized = torch.where(logits > 0, logits / rp, logits * rp)
        logits = torch.where(seen, penalized, logits)
    if md.frequency_penalty is not None:
        logits = logits - md.frequency_penalty[:, None] * out_counts
    if md.presence_penalty is not None:
        logits = logits - md.presence_penalty[:, None] * (out_counts > 0)
    return logits


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below ``min_p`` times the top token's (after
    temperature). In logit space: below ``max_logit + log(min_p)``."""
    threshold = logits.max(dim=-1, keepdim=True).values + torch.log(min_p.clamp(min=0))[:, None]
    return logits.masked_fill(logits < threshold, float("-inf"))


# -- drawing ------------------------------------------------------------------------------------


def _uniforms(n: int, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """One uniform in [0, 1) per row (float64); rows with a generator draw from it."""
    u = torch.rand(n, dtype=torch.float64)
    for row, gen in generators.items():
        u[row] = float(torch.rand(1, dtype=torch.float64, generator=gen))
    return u


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Column index drawn from each row of (unnormalized, non-negative) ``probs``."""
    cdf = probs.double().cumsum(dim=-1)
    x = (u * cdf[:, -1]).unsqueeze(1)
    idx = torch.searchsorted(cdf, x, right=True).squeeze(1).clamp(max=probs.shape[-1] - 1)
    # u * total can round up to total; then take the last token with mass
    bad = probs.gather(1, idx[:, None]).squeeze(1) <= 0
    if bool(bad.any()):
        last = probs.shape[-1] - 1 - (probs.flip(-1) > 0).int().argmax(dim=-1)
        idx = torch.where(bad, last, idx)
    return idx


def draw(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    min_p: torch.Tensor | None,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    generators: dict[int, torch.Generator],
) -> torch.Tensor:
    """A token per row from ``softmax(logits / temperature)`` restricted by min-p, top-k, then
    top-p (top-p of the top-k distribution when both are set).

    Rows with a top-k never touch the whole vocabulary after one ``topk`` of the raw logits
    (temperature does not change the order, and min-p only compares with the best token).
    Other rows with a top-p first try the best 1024 tokens and sort the whole row only when
    those hold less than the nucleus."""
    batch, vocab = logits.shape
    dev = logits.device
    out = torch.empty(batch, dtype=torch.int64, device=dev)
    k = top_k if top_k is not None else torch.zeros(batch, dtype=torch.int64, device=dev)
    p = top_p if top_p is not None else torch.ones(batch, device=dev)
    mp = min_p if min_p is not None else torch.zeros(batch, device=dev)
    u = _uniforms(batch, generators).to(dev)

    k_rows = torch.nonzero(k > 0).squeeze(1)
    if k_rows.numel():
        kk = k[k_rows].clamp(max=vocab)
        values, ids = logits.index_select(0, k_rows).topk(int(kk.max()), dim=-1)
        values = values / temperature[k_rows, None]
        values = values.masked_fill(torch.arange(values.shape[1], device=dev)[None, :] >= kk[:, None], float("-inf"))
        values = _min_p_sorted(values, mp[k_rows])
        probs = (values - values[:, :1]).exp()  # unnormalized top-k distribution
        probs = _nucleus(probs, probs.sum(dim=-1), p[k_rows])
        out[k_rows] = ids.gather(1, _inverse_cdf(probs, u[k_rows])[:, None]).squeeze(1)

    rest = torch.nonzero(k <= 0).squeeze(1)
    if rest.numel():
        scaled = logits.index_select(0, rest) / temperature[rest, None]
        if bool((mp[rest] > 0).any()):
            scaled = apply_min_p(scaled, mp[rest])
        pr = p[rest]
        nucleus_rows = torch.nonzero(pr < 1.0).squeeze(1)
        plain_rows = torch.nonzero(pr >= 1.0).squeeze(1)
        if plain_rows.numel():
            sub = scaled.index_select(0, plain_rows)
            probs = (sub - sub.max(dim=-1, keepdim=True).values).exp()
            out[rest[plain_rows]] = _inverse_cdf(probs, u[rest[plain_rows]])
        if nucleus_rows.numel():
            sub = scaled.index_select(0, nucleus_rows)
            out[rest[nucleus_rows]] = _draw_nucleus(sub, pr[nucleus_rows], u[rest[nucleus_rows]])
    return out


def _draw_nucleus(logits: torch.Tensor, top_p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Top-p draw without a top-k: from the best 1024 candidates when they hold the nucleus,
    else (for those rows only) from the whole sorted row."""
    vocab = logits.shape[-1]
    top = logits.max(dim=-1, keepdim=True).values
    total = (logits - top).exp().sum(dim=-1)  # mass of each whole row (unnormalized)
    width = min(vocab, _TOP_P_CANDIDATES)
    values, ids = logits.topk(width, dim=-1)
    probs = (values - top).exp()
    out = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    wide = (probs.sum(dim=-1) < top_p * total) if width < vocab else torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    fits = torch.nonzero(~wide).squeeze(1)
    if fits.numel():
        kept = _nucleus(probs[fits], total[fits], top_p[fits])
        out[fits] = ids[fits].gather(1, _inverse_cdf(kept, u[fits])[:, None]).squeeze(1)
    wide_rows = torch.nonzero(wide).squeeze(1)
    if wide_rows.numel():
        values, ids = logits[wide_rows].sort(dim=-1, descending=True)
        kept = _nucleus((values - top[wide_rows]).exp(), total[wide_rows], top_p[wide_rows])
        out[wide_rows] = ids.gather(1, _inverse_cdf(kept, u[wide_rows])[:, None]).squeeze(1)
    return out


def _min_p_sorted(values: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """min-p on candidates sorted best first (column 0 is the best token of the row)."""
    if not bool((min_p > 0).any()):
        return values
    threshold = values[:, :1] + torch.log(min_p.clamp(min=0))[:, None]
    return values.masked_fill(values < threshold, float("-inf"))


def _nucleus(probs: torch.Tensor, total: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Zero the candidates (sorted best first, unnormalized, row mass ``total``) outside the
    top-p nucleus: a token stays while the mass of better tokens is below ``top_p``."""
    if not bool((top_p < 1.0).any()):
        return probs
    before = probs.cumsum(dim=-1) - probs
    keep = (before < top_p[:, None] * total[:, None]) | (top_p[:, None] >= 1.0)
    return probs.masked_fill(~keep, 0.0)


# -- logprobs -----------------------------------------------------------------------------------


def gather_logprobs(logprobs: torch.Tensor, num: int | None, token_ids: torch.Tensor) -> LogprobsTensors:
    """Logprob and rank of ``token_ids`` (one per row) plus each row's top-``num`` (``-1``:
    the whole vocabulary, best first)."""
    vocab = logprobs.shape[-1]
    k = vocab if num == -1 else int(num or 0)
    chosen = logprobs.gather(1, token_ids[:, None].long())
    ranks = (logprobs > chosen).sum(dim=-1) + 1
    if k > 0:
        top_values, top_ids = logprobs.topk(min(k, vocab), dim=-1)
        ids = torch.cat([token_ids[:, None].long(), top_ids], dim=1)
        values = torch.cat([chosen, top_values], dim=1)
    else:
        ids, values = token_ids[:, None].long(), chosen
    return LogprobsTensors(ids, values, ranks)


def seeded_generator(seed: int) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(int(seed) % (2**63))
    return gen


def make_metadata(rows: list[Any], vocab: int, *, generators: dict[int, torch.Generator] | None = None) -> SamplingMetadata:
    """Build :class:`SamplingMetadata` from per-row objects with ``sampling_params``,
    ``output_token_ids``, ``prompt_token_ids`` and optional ``allowed_mask`` / ``bias`` caches
    (the model runner's request states)."""
    params = [r.sampling_params for r in rows]
    temps = [float(sp.temperature) for sp in params]
    greedy = [t < _GREEDY_EPS for t in temps]
    md = SamplingMetadata(
        temperature=torch.tensor(temps, dtype=torch.float32),
        all_greedy=all(greedy),
        all_random=not any(greedy),
        generators=generators or {},
    )
    if any(sp.top_k > 0 for sp in params):
        md.top_k = torch.tensor([sp.top_k for sp in params], dtype=torch.int64)
    if any(sp.top_p < 1.0 for sp in params):
        md.top_p = torch.tensor([sp.top_p for sp in params], dtype=torch.float32)
    if any(sp.min_p > 0.0 for sp in params):
        md.min_p = torch.tensor([sp.min_p for sp in params], dtype=torch.float32)
    wanted = [sp.logprobs for sp in params if sp.logprobs is not None]
    if wanted:
        md.max_num_logprobs = -1 if -1 in wanted else max(wanted)
    if any(sp.allowed_token_ids is not None for sp in params):
        mask = torch.ones(len(rows), vocab, dtype=torch.bool)
        for i, r in enumerate(rows):
            if r.sampling_params.allowed_token_ids is not None:
                mask[i] = r.allowed_mask(vocab)
        md.allowed_mask = mask
    ban_rows: list[int] = []
    ban_ids: list[int] = []
    bias_rows: list[int] = []
    bias_ids: list[int] = []
    bias_values: list[float] = []
    for i, r in enumerate(rows):
        sp = r.sampling_params
        out = r.output_token_ids
        for word in sp.bad_words_token_ids:
            # the last token of a bad word is banned when the tokens before it were just generated
            prefix = word[:-1]
            if not prefix or out[len(out) - len(prefix):] == prefix:
                ban_rows.append(i)
                ban_ids.append(word[-1])
        if len(out) < sp.min_tokens:
            stops = list(sp.stop_token_ids)
            eos = getattr(r, "eos_token_id", None)
            if eos is not None and not sp.ignore_eos:
                stops.append(eos)
            ban_rows += [i] * len(stops)
            ban_ids += stops
        if sp.logit_bias:
            bias_rows += [i] * len(sp.logit_bias)
            bias_ids += list(sp.logit_bias.keys())
            bias_values += list(sp.logit_bias.values())
    if ban_rows:
        md.banned = (torch.tensor(ban_rows), torch.tensor(ban_ids))
    if bias_rows:
        md.logit_bias = (torch.tensor(bias_rows), torch.tensor(bias_ids), torch.tensor(bias_values, dtype=torch.float32))
    if any(sp.has_penalties for sp in params):
        md.output_token_ids = [r.output_token_ids for r in rows]
        if any(sp.presence_penalty != 0.0 for sp in params):
            md.presence_penalty = torch.tensor([sp.presence_penalty for sp in params], dtype=torch.float32)
        if any(sp.frequency_penalty != 0.0 for sp in params):
            md.frequency_penalty = torch.tensor([sp.frequency_penalty for sp in params], dtype=torch.float32)
        if any(sp.repetition_penalty != 1.0 for sp in params):
            md.repetition_penalty = torch.tensor([sp.repetition_penalty for sp in params], dtype=torch.float32)
            md.prompt_token_ids = [r.prompt_token_ids for r in rows]
    return md


__all__ = [
    "LogprobsTensors",
    "Sampler",
    "SamplerOutput",
    "SamplingMetadata",
    "apply_logits_processors",
    "draw",
    "gather_logprobs",
    "make_metadata",
]
