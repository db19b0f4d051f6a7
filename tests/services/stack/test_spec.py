"""StackConfig.from_env: the services' own variables choose the model; QUIRE_STACK_* the rest."""

from __future__ import annotations

import pytest

from services.stack.spec import SERVICE_VARIABLES, StackConfig, env_variable, stack_processes
from tests.deploy import service_flags


def _settings(config: StackConfig) -> dict[str, object]:
    """Each Quire process's settings, parsed as the process parses its argv and environment."""
    return {
        p.name: service_flags.parse(p.argv[2], p.argv[3:], p.env)
        for p in stack_processes(config)
        if p.name != "redis"
    }


def test_the_model_variables_are_the_services_own() -> None:
    assert SERVICE_VARIABLES == {
        "model": "QUIRE_MODEL",
        "num_kv_blocks": "QUIRE_NUM_KV_BLOCKS",
        "executor_dtype": "QUIRE_DTYPE",
    }
    assert env_variable("router_port") == "QUIRE_STACK_ROUTER_PORT"
    # Each of them is a field of the executor's settings under exactly that name.
    executor = service_flags.setting_names("services.executor")
    assert set(SERVICE_VARIABLES.values()) <= executor


def test_from_env_reads_them_and_every_process_gets_them() -> None:
    env = {
        "QUIRE_MODEL": "models/quire-tiny",
        "QUIRE_NUM_KV_BLOCKS": "64",
        "QUIRE_DTYPE": "bfloat16",
        "QUIRE_STACK_ROUTER_PORT": "9000",
        "QUIRE_STACK_NUM_EXECUTORS": "3",
        "QUIRE_STACK_ADDRESS_BY_NAME": "no",
    }
    config = StackConfig.from_env(env)
    assert (config.model, config.num_kv_blocks, config.executor_dtype) == (
        "models/quire-tiny",
        64,
        "bfloat16",
    )
    assert (config.router_port, config.num_executors, config.address_by_name) == (9000, 3, False)
    assert StackConfig.from_env({"QUIRE_STACK_PIN_EXECUTORS": "yes"}).pin_executors is True
    settings = _settings(config)
    assert set(settings) == {"memory-manager", "executor-0", "executor-1", "executor-2", "router"}
    for name, s in settings.items():
        if name.startswith("executor-"):
            assert (s.model, s.num_kv_blocks, s.dtype) == ("models/quire-tiny", 64, "bfloat16")
    assert settings["router"].model == "models/quire-tiny"  # the router and executors agree
    assert settings["router"].port == 9000


def test_defaults_leave_the_pool_to_the_executor() -> None:
    config = StackConfig.from_env({"QUIRE_NUM_KV_BLOCKS": "", "QUIRE_MODEL": ""})
    assert config == StackConfig()
    assert config.num_kv_blocks is None and config.executor_dtype == "auto"
    settings = _settings(config)
    assert settings["executor-0"].num_kv_blocks is None
    assert settings["router"].model == settings["executor-1"].model == config.model


def test_overrides_win_over_the_environment() -> None:
    config = StackConfig.from_env({"QUIRE_MODEL": "a"}, model="b", num_kv_blocks=8)
    assert (config.model, config.num_kv_blocks) == ("b", 8)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"QUIRE_STACK_MODEL": "x"}, "QUIRE_STACK_MODEL is not read: set QUIRE_MODEL"),
        ({"QUIRE_STACK_NUM_KV_BLOCKS": "8"}, "set QUIRE_NUM_KV_BLOCKS"),
        ({"QUIRE_STACK_EXECUTOR_DTYPE": "float32"}, "set QUIRE_DTYPE"),
        ({"QUIRE_NUM_KV_BLOCKS": "many"}, "QUIRE_NUM_KV_BLOCKS='many' is not an integer"),
        ({"QUIRE_STACK_ROUTER_PORT": "x"}, "QUIRE_STACK_ROUTER_PORT='x' is not an integer"),
    ],
)
def test_wrong_variables_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("*", r"\*")):
        StackConfig.from_env(env)


def test_pulls_are_on_by_default_and_turn_off_together() -> None:
    on = _settings(StackConfig())
    assert on["executor-0"].enable_pulls and on["router"].routing_pulls
    config = StackConfig.from_env(
        {"QUIRE_STACK_EXECUTOR_ENABLE_PULLS": "false", "QUIRE_STACK_ROUTER_ROUTING_PULLS": "0"}
    )
    assert (config.executor_enable_pulls, config.router_routing_pulls) == (False, False)
    off = _settings(config)
    assert not off["executor-0"].enable_pulls and not off["executor-1"].enable_pulls
    assert not off["router"].routing_pulls


def test_shared_cores_give_each_executor_a_slot_of_one_file() -> None:
    config = StackConfig()
    assert config.shares_cores  # the default for a local stack
    settings = _settings(config)
    executors = [settings["executor-0"], settings["executor-1"]]
    assert {s.share_cores_file for s in executors} == {config.share_cores_file}
    assert [s.share_cores_slot for s in executors] == [0, 1]
    assert all(s.share_cores_total >= 1 for s in executors)
    # a fixed thread count, pinned executors, containers or a lone executor share nothing
    for env in (
        {"QUIRE_STACK_EXECUTOR_TORCH_THREADS": "2"},
        {"QUIRE_STACK_PIN_EXECUTORS": "true"},
        {"QUIRE_STACK_NUM_EXECUTORS": "1"},
        {"QUIRE_STACK_EXECUTOR_SHARE_CORES": "false"},
    ):
        plain = StackConfig.from_env({"QUIRE_STACK_EXECUTOR_SHARE_CORES": "true", **env})
        assert not plain.shares_cores
        flags = [
            f for p in stack_processes(plain) if p.name.startswith("executor-") for f in p.argv
        ]
        assert "--torch-threads" in flags or "taskset" in flags
        assert "--share-cores-file" not in flags
