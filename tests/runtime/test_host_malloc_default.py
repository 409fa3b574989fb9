"""The host allocator is left alone unless asked (issue 14 item 7: `keep` raised a peak 10.7 -> 18.5 GB)."""

import pytest

from jaxrl.runtime import host_memory


@pytest.fixture
def cpu_host(monkeypatch):
    calls = []
    monkeypatch.setattr(host_memory, "accelerator_visible", lambda: False)
    monkeypatch.setattr(host_memory, "keep_freed_buffers", lambda: calls.append("mallopt") or True)
    return calls


def test_unset_means_default_even_without_an_accelerator(cpu_host):
    assert host_memory.DEFAULT_MODE == "default"
    assert host_memory.configure_from_env({}) is False
    assert host_memory.configure_from_env({"JAXRL_HOST_MALLOC": ""}) is False
    assert cpu_host == []  # mallopt never called


@pytest.mark.parametrize("mode", ["keep", "auto", " KEEP "])
def test_keep_and_auto_are_opt_in(cpu_host, mode):
    assert host_memory.configure_from_env({"JAXRL_HOST_MALLOC": mode}) is True
    assert cpu_host == ["mallopt"]
