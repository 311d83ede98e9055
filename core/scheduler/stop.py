"""The stop conditions a request's new token is checked against (EOS, stop token ids, max_tokens,
max_model_len); stop strings are the detokenizer's (front end)."""

from __future__ import annotations

from host.contracts.request import Request, RequestStatus


def check_stop(request: Request, max_model_len: int) -> bool:
    """Apply the stop conditions to the token just appended; sets status and stop_reason."""
    sp = request.sampling_params
    output = request.output_token_ids
    num_output = len(output)
    last = output[-1]
    # EOS and stop token ids count only once min_tokens tokens precede them
    if num_output > sp.min_tokens:
        if not sp.ignore_eos and last == request.eos_token_id:
            request.status = RequestStatus.FINISHED_STOPPED
            return True
        if last in sp.stop_token_ids:
            request.status = RequestStatus.FINISHED_STOPPED
            request.stop_reason = last
            return True
    if (sp.max_tokens is not None and num_output >= sp.max_tokens) or len(request.all_token_ids) >= max_model_len:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False
