"""server.gpu_layers (auto, all, a number; 0 passed explicitly) on every tool's command line, the
offload check on a server's log, and the exporter's placement of a server on its GPUs (its log's
PCI address, a target's gpus=, MIG slices, a CPU server, a restart that appends to the log)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fake_nvml import FakeGpu, FakeNvml
from quantload.config import load_config
from quantload.errors import ConfigError
from quantload.exporter import start_exporter
from quantload.exporter.placement import LogFollower, server_gpus
from quantload.exporter.targets import parse_target, targets_from_specs
from quantload.gpus import read_gpu_inventory
from quantload.llamacpp.bench import bench_command
from quantload.llamacpp.offload import check_offload, gpu_layer_args, parse_offload
from quantload.llamacpp.perplexity import perplexity_command
from quantload.llamacpp.server import ServerSpec, free_port
from quantload.llamacpp.toolchain import Toolchain
from quantload.tune.space import configurations

H100_LOAD = (
    "llama_model_load_from_file_impl: using device CUDA0 (NVIDIA H100 80GB HBM3) (0000:3b:00.0) - 80000 MiB free\n"
    "load_tensors: offloading output layer to GPU\n"
    "load_tensors: offloading 24 repeating layers to GPU\n"
    "load_tensors: offloaded 25/25 layers to GPU\n"
    "load_tensors:        CUDA0 model buffer size =   500.00 MiB\n"
)
TWO_GPU_LOAD = (
    "llama_model_load_from_file_impl: using device CUDA0 (NVIDIA A10) (0000:3b:00.0) - 22000 MiB free\n"
    "llama_model_load_from_file_impl: using device CUDA1 (NVIDIA A10) (0000:65:00.0) - 22000 MiB free\n"
    "load_tensors: offloaded 10/25 layers to GPU\n"
)


def _toolchain(gpu_layers: object) -> Toolchain:
    tools = {name: Path(f"/bin/{name}") for name in ("llama-server", "llama-bench", "llama-perplexity")}
    return Toolchain(tools, "PATH", "version: 1", gpu_layers=gpu_layers)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("setting", "server", "bench"),
    [("auto", "auto", "999"), ("all", "all", "999"), ("0", "0", "0"), ("12", "12", "12")],
)
def test_gpu_layers_reach_the_server_the_bench_and_perplexity(
    tmp_path: Path, setting: str, server: str, bench: str
) -> None:
    value = load_config(tmp_path, {"QUANTLOAD_SERVER__GPU_LAYERS": setting}).settings.server.gpu_layers
    command = ServerSpec(Path("m.gguf"), "m", gpu_layers=value).command(Path("llama-server"), 8080)
    assert command[command.index("-ngl") + 1] == server  # 0 too: a CUDA build's own default is auto
    chain = _toolchain(value)
    measured = bench_command(Path("llama-bench"), Path("m.gguf"), 512, 128, 5, 0, chain.layer_args("llama-bench"))
    assert measured[measured.index("-ngl") + 1] == bench  # llama-bench knows no auto or all
    scored = perplexity_command(
        Path("llama-perplexity"), Path("m.gguf"), Path("t.txt"), 512, 4, 0, chain.layer_args("llama-perplexity")
    )
    assert scored[scored.index("-ngl") + 1] == server
    assert chain.version_record()["gpu_layers"] == value
    assert gpu_layer_args("llama-quantize", value) == []  # loads no model to run


def test_gpu_layers_refuses_what_is_not_auto_all_or_a_count(tmp_path: Path) -> None:
    for bad in ("most", "-1", "1.5"):
        with pytest.raises(ConfigError, match="auto, all or a number of layers"):
            load_config(tmp_path, {"QUANTLOAD_SERVER__GPU_LAYERS": bad})


def test_the_tuner_varies_the_gpu_layers_only_where_asked(tmp_path: Path) -> None:
    plain = load_config(tmp_path, {}).settings
    assert {config.gpu_layers for config in configurations(plain)} == {""}
    assert all("ngl" not in config.key for config in configurations(plain))
    varied = load_config(tmp_path, {"QUANTLOAD_TUNE__GPU_LAYERS": "all,0"}).settings
    found = configurations(varied)
    assert {config.gpu_layers for config in found} == {"all", "0"}
    assert len(found) == 2 * len(configurations(plain))
    flags = {config.key: config.server_flags(varied, "x").gpu_layers for config in found}
    assert {value for key, value in flags.items() if key.endswith("ngl-0")} == {0}
    assert {value for key, value in flags.items() if key.endswith("ngl-all")} == {"all"}


def test_the_offload_check_reads_the_last_load_and_its_devices() -> None:
    log = parse_offload(H100_LOAD)
    assert (log.offloaded, log.layers) == (25, 25)
    assert [(d.name, d.pci_bus_id, d.free_mib) for d in log.devices] == [("CUDA0", "0000:3b:00.0", 80000)]
    check = check_offload("all", log)
    assert check.verdict == "as asked" and check.on_gpu and "25/25 layers offloaded to CUDA0" in check.line
    restarted = parse_offload(H100_LOAD + TWO_GPU_LOAD)  # a restart appends: the latest load counts
    assert (restarted.offloaded, [d.name for d in restarted.devices]) == (10, ["CUDA0", "CUDA1"])


@pytest.mark.parametrize(
    ("requested", "log", "verdict", "said"),
    [
        ("all", TWO_GPU_LOAD, "fewer than asked", "fewer than the 25 asked"),
        (10, TWO_GPU_LOAD, "as asked", "asked for 10"),
        (40, TWO_GPU_LOAD, "fewer than asked", "fewer than the 25 asked"),
        ("auto", TWO_GPU_LOAD, "as asked", "what fitted"),
        (0, "load_tensors: offloaded 0/25 layers to GPU\n", "on the CPU", "as asked"),
        ("all", "load_tensors: offloaded 0/25 layers to GPU\n", "fewer than asked", "on the CPU"),
        ("all", "load_tensors: CPU model buffer size = 500 MiB\n", "on the CPU", "no GPU backend"),
        (0, "", "on the CPU", "every layer on the CPU"),
    ],
)
def test_the_offload_check_says_whether_the_layers_asked_for_went_to_the_gpu(
    requested: object, log: str, verdict: str, said: str
) -> None:
    check = check_offload(requested, parse_offload(log))  # type: ignore[arg-type]
    assert check.verdict == verdict and said in check.line, check.line


def _inventory() -> object:
    return read_gpu_inventory(
        FakeNvml(
            [
                FakeGpu(uuid="GPU-a", pci_bus_id="00000000:3B:00.0"),
                FakeGpu(uuid="GPU-b", pci_bus_id="00000000:65:00.0"),
                FakeGpu(uuid="GPU-m", pci_bus_id="00000000:B1:00.0", mig_uuids=("MIG-0", "MIG-1")),
            ]
        ).loader
    )


def test_a_server_is_placed_on_the_gpus_its_log_names_and_no_other() -> None:
    inventory = _inventory()
    one = server_gpus(parse_offload(H100_LOAD), (), inventory)  # type: ignore[arg-type]
    assert [(g.gpu.uuid, g.source, g.labels["mig"]) for g in one] == [("GPU-a", "log", "no")]
    two = server_gpus(parse_offload(TWO_GPU_LOAD), (), inventory)  # type: ignore[arg-type]
    assert sorted(g.gpu.uuid for g in two) == ["GPU-a", "GPU-b"]
    on_cpu = parse_offload("load_tensors: offloaded 0/25 layers to GPU\n")
    assert server_gpus(on_cpu, (), inventory) == ()  # type: ignore[arg-type]
    named = server_gpus(parse_offload(""), ("MIG-1", "1"), inventory)  # type: ignore[arg-type]
    assert [(g.gpu.uuid, g.labels["mig"], g.source) for g in named] == [("GPU-m", "yes", "target"), ("GPU-b", "no", "target")]


def test_the_log_is_followed_in_bounded_steps_and_a_restart_replaces_the_placement(tmp_path: Path) -> None:
    log = tmp_path / "llama-server.log"
    log.write_text("main: loading model\n" + H100_LOAD[:60])  # a line cut in half
    follower = LogFollower(log)
    assert follower.follow().offloaded is None
    with log.open("a") as more:
        more.write(H100_LOAD[60:])
    assert follower.follow().offloaded == 25
    with log.open("a") as more:
        more.write("srv  update_slots: all slots are idle\n" + TWO_GPU_LOAD)
    placed = follower.follow()
    assert placed.offloaded == 10 and [d.name for d in placed.devices] == ["CUDA0", "CUDA1"]
    log.write_text("load_tensors: offloaded 0/25 layers to GPU\n")  # a new, shorter log
    assert follower.follow().offloaded == 0


def test_an_exporter_target_names_its_gpus() -> None:
    target = parse_target("q8=http://h:1,quant=Q8_0,gpus=0+GPU-b+MIG-1")
    assert target.gpus == ("0", "GPU-b", "MIG-1")
    assert parse_target("q8=http://h:1").gpus == ()


def test_the_exporter_serves_each_servers_gpus_and_layers(tmp_path: Path) -> None:
    (tmp_path / "q8.log").write_text(H100_LOAD)
    (tmp_path / "f16.log").write_text("load_tensors: offloaded 0/25 layers to GPU\n")
    nvml = FakeNvml([FakeGpu(uuid="GPU-a", pci_bus_id="00000000:3B:00.0"), FakeGpu(uuid="GPU-b")])
    targets = targets_from_specs([
        f"q8=http://127.0.0.1:{free_port()},quant=Q8_0,model=m,log={tmp_path / 'q8.log'}",
        f"f16=http://127.0.0.1:{free_port()},quant=F16,model=m,log={tmp_path / 'f16.log'}",
    ])  # fmt: skip
    exporter = start_exporter(targets, port=0, timeout_s=0.5, nvml=nvml.loader)
    try:
        text = httpx.get(f"{exporter.url}/metrics", timeout=10).text
    finally:
        exporter.stop()
    samples = {
        (sample.name, sample.labels.get("quant", sample.labels.get("uuid", ""))): sample
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    info = samples[("quantload_server_gpu_info", "Q8_0")]
    assert info.labels["uuid"] == "GPU-a" and info.labels["source"] == "log" and info.labels["mig"] == "no"
    assert ("quantload_server_gpu_info", "F16") not in samples  # on the CPU: no GPU is its
    assert samples[("quantload_server_offloaded_layers", "F16")].value == 0
    assert samples[("quantload_server_offloadable_layers", "Q8_0")].value == 25
    assert samples[("quantload_gpu_power_limit_watts", "GPU-a")].value == 700
    assert samples[("quantload_gpu_mig_enabled", "GPU-b")].value == 0


def test_layers_counted_as_offloaded_without_a_gpu_device_ran_on_the_cpu() -> None:
    # a CPU build with the RPC backend compiled in counts every layer as offloaded, on no device
    log = parse_offload("load_tensors: offloading 29 repeating layers to GPU\nload_tensors: offloaded 31/31 layers to GPU\n")
    auto = check_offload("auto", log)
    assert auto.verdict == "on the CPU" and not auto.on_gpu and "no GPU device" in auto.line
    assert check_offload("all", log).verdict == "fewer than asked"

