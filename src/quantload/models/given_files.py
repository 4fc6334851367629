"""Files the user already has: GGUF paths, a folder of them, or a Hugging Face repo of GGUFs
(`hf:OWNER/REPO[:GLOB]`, through the Hub client); each one's type, size, importance matrix and
source read from its own metadata.

Refused in one line before anything is measured: a path that is not there, a file that is not
GGUF, a file split in parts (`-00001-of-00003.gguf`, `split.count`), files of different models
(architecture, vocabulary or tensor shapes differ), more files than `prepare.max_files`. The
reference for KLD is an F32/BF16/F16 among them (best precision first) or `prepare.reference`;
without one the run measures perplexity only and says so.
"""

from __future__ import annotations

import fnmatch
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from quantload.config import PrepareSettings
from quantload.errors import ConfigError, OfflineError
from quantload.models.file_plan import IMATRIX_SUFFIX
from quantload.models.gguf_meta import GgufSummary, read_gguf
from quantload.models.gguf_scan import scan_gguf
from quantload.models.imatrix_file import imatrix_metadata
from quantload.models.manifest import Manifest, ManifestEntry, sha256_of
from quantload.models.moe import file_moe_facts
from quantload.models.sources import HF_DEFAULT_ENDPOINT, require_reachable
from quantload.progress import ProgressCallback, no_progress

HF_PREFIX = "hf:"
SPLIT_NAME = re.compile(r"-\d{5}-of-\d{5}\.gguf$")
REFERENCE_ORDER: tuple[str, ...] = ("F32", "BF16", "F16")
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class GivenFile:
    """One file to measure and where it came from."""

    path: Path
    origin: str


def _hub_files(spec: str, cache: Path, environ: Mapping[str, str], limit: int) -> list[GivenFile]:
    """The GGUFs of `hf:OWNER/REPO[:GLOB]`, downloaded (resumably) into the cache."""
    from huggingface_hub import HfApi, hf_hub_download

    rest = spec[len(HF_PREFIX) :]
    repo, _, pattern = rest.partition(":")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise ConfigError(
            f"prepare.files: {spec!r} is not hf:OWNER/REPO[:GLOB]", "e.g. hf:org/model-GGUF:*Q4_K_M*"
        )
    configured = environ.get("QUANTLOAD_HF_ENDPOINT") or environ.get("HF_ENDPOINT")
    endpoint = (configured or HF_DEFAULT_ENDPOINT).rstrip("/")
    hint = "give local GGUF paths instead (prepare.files), or check the network"
    require_reachable(endpoint, f"the file list of {repo}", hint)
    token = environ.get("HF_TOKEN") or None
    try:
        names = HfApi(endpoint=endpoint, token=token).list_repo_files(repo)
    except Exception as error:  # the Hub client's errors: 401/404, offline, a cut connection
        reason = str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
        raise OfflineError(f"cannot list the files of {repo} on Hugging Face: {reason}", hint) from None
    ggufs = sorted(
        n for n in names if n.endswith(".gguf") and fnmatch.fnmatch(Path(n).name, pattern or "*")
    )
    if not ggufs:
        raise ConfigError(
            f"prepare.files: {spec} matches no .gguf file in {repo}", "check the repo and the glob"
        )
    if len(ggufs) > limit:
        raise ConfigError(
            f"prepare.files: {spec} matches {len(ggufs)} GGUF files, more than prepare.max_files = {limit}",
            f"narrow it with a glob, e.g. hf:{repo}:*Q4_K_M*",
        )
    local_dir = cache / "models" / repo.replace("/", "--")
    found = []
    for name in ggufs:
        if SPLIT_NAME.search(name):
            raise ConfigError(f"prepare.files: {repo}/{name} is one part of a split GGUF", _SPLIT_HINT)
        try:
            path = hf_hub_download(repo_id=repo, filename=name, local_dir=local_dir, endpoint=endpoint,
                                   token=token, etag_timeout=10)  # fmt: skip
        except Exception as error:
            reason = str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
            raise OfflineError(f"cannot download {repo}/{name}: {reason}", hint) from None
        found.append(GivenFile(Path(str(path)), f"https://huggingface.co/{repo} ({name})"))
    return found


_SPLIT_HINT = "merge it first: llama-gguf-split --merge FIRST-PART.gguf WHOLE.gguf"


def expand_files(
    specs: Sequence[str], cache: Path, environ: Mapping[str, str], limit: int
) -> list[GivenFile]:
    """Every file `specs` names (a folder gives its *.gguf, sorted), each checked to be a whole,
    unsplit GGUF; ConfigError or ModelError naming the file otherwise."""
    found: list[GivenFile] = []
    for spec in specs:
        if spec.startswith(HF_PREFIX):
            found += _hub_files(spec, cache, environ, limit)
            continue
        path = Path(spec).expanduser()
        if path.is_dir():
            inside = sorted(p for p in path.glob("*.gguf") if p.is_file())
            if not inside:
                raise ConfigError(
                    f"prepare.files: folder {path} holds no .gguf file", "give GGUF files or a folder of them"
                )
            found += [GivenFile(p.resolve(), f"local file {p.resolve()}") for p in inside]
        elif path.exists():
            found.append(GivenFile(path.resolve(), f"local file {path.resolve()}"))
        else:
            raise ConfigError(f"prepare.files: {path} does not exist", "check the path")
    if len(found) > limit:
        raise ConfigError(
            f"prepare.files names {len(found)} files, more than prepare.max_files = {limit}",
            "measure fewer at once, or raise prepare.max_files",
        )
    for item in found:
        if SPLIT_NAME.search(item.path.name):
            raise ConfigError(f"prepare.files: {item.path} is one part of a split GGUF", _SPLIT_HINT)
    return found


def _shapes(path: Path) -> dict[str, tuple[int, ...]]:
    return {name: tensor.dims for name, tensor in scan_gguf(path).tensors.items()}


def _vocabulary(shapes: Mapping[str, tuple[int, ...]]) -> int | None:
    embedding = shapes.get("token_embd.weight")
    return embedding[-1] if embedding else None


def check_one_model(summaries: Sequence[GgufSummary]) -> None:
    """ConfigError (one line, naming both files) when the files are not quantizations of one
    model: architecture, vocabulary or tensor shapes differ."""
    if len(summaries) < 2:
        return
    first = summaries[0]
    first_shapes = _shapes(first.path)
    for other in summaries[1:]:
        if other.architecture != first.architecture:
            why = f"architecture {first.architecture} against {other.architecture}"
        else:
            shapes = _shapes(other.path)
            vocab_a, vocab_b = _vocabulary(first_shapes), _vocabulary(shapes)
            if vocab_a != vocab_b:
                why = f"vocabulary {vocab_a} against {vocab_b} tokens"
            elif shapes != first_shapes:
                differing = sorted(set(shapes) ^ set(first_shapes)) or sorted(
                    n for n in shapes if shapes[n] != first_shapes.get(n)
                )
                why = f"tensor shapes differ ({', '.join(differing[:3])})"
            else:
                continue
        raise ConfigError(
            f"{first.path.name} and {other.path.name} are not one model: {why}",
            "measure files of one model per run",
        )


def _check_whole(summary: GgufSummary) -> None:
    count = summary.metadata.get("split.count")
    if isinstance(count, int) and count > 1:
        raise ConfigError(
            f"prepare.files: {summary.path} is one part of a split GGUF ({count} parts)", _SPLIT_HINT
        )


def _labels(summaries: Sequence[GgufSummary]) -> list[str]:
    """A type label per file (TYPE-imatrix when made with one), the file stem where two share one."""
    labels = [
        s.file_type + (IMATRIX_SUFFIX if imatrix_metadata(s.metadata) else "") for s in summaries
    ]
    counts = Counter(labels)
    return [
        label if counts[label] == 1 else _SAFE.sub("-", s.path.stem)
        for label, s in zip(labels, summaries, strict=True)
    ]


def reference_of(summaries: Sequence[GgufSummary], labels: Sequence[str]) -> str | None:
    """The label of the best-precision file (F32, then BF16, then F16), or None."""
    for kind in REFERENCE_ORDER:
        for summary, label in zip(summaries, labels, strict=True):
            if summary.file_type == kind:
                return label
    return None


def check_given_files(prepare: PrepareSettings, cache: Path) -> list[GgufSummary]:
    """Every check `adopt_files` makes, for local files, without hashing them."""
    given = expand_files(prepare.files, cache, {}, prepare.max_files)
    return _checked_summaries(prepare, given)


def _checked_summaries(prepare: PrepareSettings, given: list[GivenFile]) -> list[GgufSummary]:
    if prepare.reference is not None:
        reference_path = prepare.reference.expanduser().resolve()
        if not any(item.path == reference_path for item in given):
            given.append(GivenFile(reference_path, f"local file {reference_path} (prepare.reference)"))
    summaries = [read_gguf(item.path) for item in given]  # not GGUF, cut short: ModelError naming it
    for summary in summaries:
        _check_whole(summary)
    if prepare.reference is not None:
        chosen = summaries[[i.path for i in given].index(prepare.reference.expanduser().resolve())]
        if chosen.file_type not in REFERENCE_ORDER:
            raise ConfigError(
                f"prepare.reference {chosen.path} is {chosen.file_type}, not F32, BF16 or F16",
                "give the unquantized GGUF as the reference",
            )
    check_one_model(summaries)
    return summaries


def adopt_files(
    prepare: PrepareSettings,
    cache: Path,
    environ: Mapping[str, str],
    llama_cpp: dict[str, object],
    progress: ProgressCallback = no_progress,
) -> Manifest:
    """The manifest of the given files (and prepare.reference), every check done first; the files
    stay where they are."""
    given = expand_files(prepare.files, cache, environ, prepare.max_files)
    summaries = _checked_summaries(prepare, given)  # appends prepare.reference to `given`
    labels = _labels(summaries)
    files: dict[str, ManifestEntry] = {}
    for index, (item, summary, label) in enumerate(zip(given, summaries, labels, strict=True)):
        progress(index, len(given), f"checking {item.path.name}")
        experts = file_moe_facts(summary)
        files[label] = ManifestEntry(
            quant=label, file=item.path.name, path=str(item.path), size_bytes=summary.size_bytes,
            sha256=sha256_of(item.path), n_params=summary.n_params, tensor_bytes=summary.tensor_bytes,
            architecture=summary.architecture, file_type=summary.file_type, made_from="given",
            seconds=0.0, made_with=_quantized_by(summary), recipe=None,
            imatrix=imatrix_metadata(summary.metadata), origin=item.origin,
            moe=experts.as_dict() if experts else None,
        )  # fmt: skip
    progress(len(given), len(given), "done")
    name = str(summaries[0].name) if summaries else "model"
    reference: str | None = reference_of(summaries, labels)
    if prepare.reference is not None:
        reference = labels[[i.path for i in given].index(prepare.reference.expanduser().resolve())]
    source = {
        "kind": "files", "name": _SAFE.sub("-", name).strip("-").lower() or "model",
        "origin": f"{len(given)} file(s) given (prepare.files)", "base_path": None,
        "base_file_type": files[reference].file_type if reference else None,
        "note": "" if reference else "no F32/BF16/F16 file among them: quality is perplexity only, no KLD",
    }  # fmt: skip
    manifest = Manifest(source=source, llama_cpp=dict(llama_cpp), files=files, reference=reference)
    return manifest.sorted_by_size()


def _quantized_by(summary: GgufSummary) -> str | None:
    by = summary.metadata.get("general.quantized_by")
    return f"quantized by {by}" if by else None
