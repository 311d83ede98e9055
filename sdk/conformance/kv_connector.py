"""The KV-connector suite: an engine with the connector keeps transformers' tokens and frees every block."""

from __future__ import annotations

from typing import Any, ClassVar

from host.sdk.conformance import tiny_model
from host.sdk.conformance.base import RegistrationCheck
from host.sdk.kv_connector import KVConnector, KVConnectorMetadata, KVConnectorRole


class KVConnectorConformance(RegistrationCheck):
    """Set ``connector`` (the :class:`KVConnector` subclass, registered in this process: through
    its installed package, or :func:`host.sdk.testing.registered_plugin` in a fixture). Optional:
    :meth:`extra_config` (``kv_connector_extra_config``; ``tmp_path`` is given for a store),
    ``kv_role`` ("kv_both").

    The engine runs twice on the same settings: the second run may load what the first saved;
    both must produce transformers' greedy tokens and leave no request or block held."""

    connector: ClassVar[type[KVConnector] | None] = None
    kv_role: ClassVar[str] = "kv_both"
    registry_kind = "kv_connectors"
    group = "host.kv_connectors"

    def registered_name(self) -> str:
        return self.connector.name

    def extra_config(self, tmp_path: Any) -> dict[str, Any]:
        return {}

    def test_has_a_name(self) -> None:
        assert self.connector is not None, "set `connector` to your KVConnector subclass"
        assert isinstance(self.connector.name, str) and self.connector.name

    def test_an_engine_with_it_keeps_the_reference_tokens_and_frees_every_block(self, tmp_path: Any) -> None:
        from host import LLM

        path, ps = tiny_model.tiny_llama(), tiny_model.prompts()
        want = tiny_model.hf_greedy_tokens(path, ps)
        config = {"kv_connector": self.connector.name, "kv_role": self.kv_role,
                  "kv_connector_extra_config": self.extra_config(tmp_path)}
        for attempt in ("first", "second"):
            llm = LLM(path, kv_transfer_config=config, **tiny_model.ENGINE_ARGS)
            try:
                assert tiny_model.greedy_tokens(llm, ps) == want, f"{self.connector.name}: the {attempt} run's tokens differ from transformers'"
                scheduler = llm.engine.scheduler
                for _ in range(200):  # transfers the connector still reports as pending
                    if not scheduler.has_pending_kv_transfers():
                        break
                    llm.engine.step()
                tiny_model.no_leaked_blocks(llm)
            finally:
                llm.shutdown()

    def test_the_scheduler_role_answers_in_the_contract_types(self, tmp_path: Any) -> None:
        from host.sdk.conformance.engine_objects import engine_config, request, scheduler_output

        config = engine_config(tiny_model.tiny_llama(), self.connector.name, self.kv_role, self.extra_config(tmp_path))
        conn = self.connector(config, KVConnectorRole.SCHEDULER)
        try:
            req = request("conformance-0", list(range(3, 40)))
            n, load_async = conn.get_num_new_matched_tokens(req, 0)
            assert n is None or (isinstance(n, int) and n >= 0), f"get_num_new_matched_tokens returned {n!r}"
            assert isinstance(load_async, bool)
            meta = conn.build_connector_meta(scheduler_output())
            assert isinstance(meta, KVConnectorMetadata), f"build_connector_meta returned {type(meta).__name__}"
            delay_free, params = conn.request_finished(req, [])
            assert delay_free is False, "a request finished with no blocks (aborted/preempted) cannot delay a free"
            assert params is None or isinstance(params, dict)
            assert all(isinstance(v, (int, float)) for v in conn.get_stats().values())
        finally:
            conn.shutdown()
