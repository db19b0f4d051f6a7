"""Everything one router process holds: tokenizer, executor directory, admission, rate
limits, clients."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quire.cluster.hash_params import HashParams
from quire.cluster.placement import WorkingSets
from quire.cluster.policies import make_policy
from quire.cluster.recent import RecentRoutes
from quire.cluster.routing import RoutingConfig
from quire.model.checkpoint import load_model_config
from services.router.admission.rate_limits import RateLimiter
from services.router.admission.slots import Admission
from services.router.directory import ExecutorDirectory
from services.router.dispatch import Dispatcher
from services.router.errors import ApiError
from services.router.executor_client import ExecutorClients
from services.router.hash_watch import HashWatch
from services.router.prompts import PromptProcessor, load_tokenizer
from services.router.router_metrics import RouterMetrics
from services.router.router_settings import RouterSettings
from services.router.stall_watch import StallDetector, StallWatch
from services.router.token_text import TokenText
from services.router.tool_templates import resolve_tool_template


@dataclass
class RouterState:
    """The collaborators the routes use; built once per app."""

    settings: RouterSettings
    tokenizer: Any
    prompts: PromptProcessor
    token_text: TokenText
    directory: ExecutorDirectory
    admission: Admission
    rate_limiter: RateLimiter
    clients: ExecutorClients
    dispatcher: Dispatcher
    stall_watch: StallWatch  # started and stopped by the public app's lifespan
    metrics: RouterMetrics
    max_model_len: int

    @classmethod
    def build(cls, settings: RouterSettings, metrics: RouterMetrics) -> RouterState:
        """Load the tokenizer and model config, wire the collaborators (no I/O to peers)."""
        model_config = load_model_config(settings.model)
        max_model_len = min(
            settings.max_model_len or model_config.max_model_len, model_config.max_model_len
        )
        tokenizer = load_tokenizer(settings.model)
        directory = ExecutorDirectory(
            redis_url=settings.redis_url,
            redis_prefix=settings.redis_prefix,
            model_names={settings.model_name, settings.extra_key},
            static_addresses=settings.executors,
            cache_s=settings.registry_cache_s,
            down_s=settings.executor_down_s,
            timeout_s=settings.redis_timeout_s,
        )
        admission = Admission(settings.max_pending_per_executor, settings.max_pending_total)
        clients = ExecutorClients(settings.tls_ca)
        prefix_config = RoutingConfig(
            block_size=settings.block_size,
            max_load_gap=settings.routing_max_load_gap,
            max_load_ratio=settings.routing_max_load_ratio,
            max_hash_load_gap=settings.routing_max_hash_load_gap,
            pulls=settings.routing_pulls,
            pull_cost_fraction=settings.routing_pull_cost_fraction,
        )
        fallback = HashParams(settings.block_size, settings.extra_key)
        dispatcher = Dispatcher(
            directory,
            admission,
            clients,
            metrics,
            make_policy(
                settings.routing_policy,
                prefix_config,
                RecentRoutes(settings.routing_recent_s),
                WorkingSets(settings.routing_placement_window_s),
            ),
            HashWatch(fallback, metrics),
            request_timeout_s=settings.request_timeout_s,
            max_retries=settings.max_retries,
            max_migrations=settings.max_migrations,
            retry_after_s=settings.retry_after_s,
            log_prompts=settings.log_prompts,
        )
        return cls(
            settings=settings,
            tokenizer=tokenizer,
            prompts=PromptProcessor(
                tokenizer,
                max_model_len,
                model_config.vocab_size,
                resolve_tool_template(
                    settings.tool_chat_template, tokenizer, settings.tool_call_parser
                ),
            ),
            token_text=TokenText(tokenizer),
            directory=directory,
            admission=admission,
            rate_limiter=RateLimiter.from_settings(settings),
            clients=clients,
            dispatcher=dispatcher,
            stall_watch=StallWatch(
                StallDetector(settings.executor_stall_s),
                dispatcher,
                directory,
                on_stalled=metrics.stalled_executors.inc,
            ),
            metrics=metrics,
            max_model_len=max_model_len,
        )

    def check_model(self, model: str | None) -> None:
        """404 in OpenAI's shape unless the request names the served model (or none)."""
        if model is not None and model != self.settings.model_name:
            raise ApiError(
                404,
                f"The model `{model}` does not exist.",
                param="model",
                code="model_not_found",
            )

    async def close(self) -> None:
        await self.clients.close()
        await self.directory.close()
        await self.rate_limiter.close()
