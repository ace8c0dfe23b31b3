"""The settings' shape: every section, its defaults and its checks, and `Settings`, the whole.

Every field carries a docstring; `settings.example.toml` is written from them (engine/config/example.py),
so the two never drift apart (a test checks it). engine/config/loading.py reads a TOML file, then
`REGEN_` environment variables, then `OPENROUTER_API_KEY` into these.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from regen.engine.money.deadline import DeadlineError, parse_deadline
from regen.engine.net.sglang_server import launch_arg_problem

ENV_PREFIX = "REGEN_"

Quantization = Literal[
    "int4", "int8", "fp4", "mxfp4", "nvfp4", "fp6", "fp8", "mxfp8", "fp16", "bf16", "fp32", "unknown"
]
RowStatus = Literal["ok", "truncated"]


class _Section(BaseModel):
    # inf and nan are refused: every number here is a real amount (docs/inputs.md, "Settings").
    model_config = ConfigDict(
        extra="forbid", use_attribute_docstrings=True, validate_default=True, allow_inf_nan=False
    )

    @field_validator("*", mode="after")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        # A NUL cannot be in a path or a header; refused here, it names the key (docs/inputs.md).
        items = value if isinstance(value, list) else [value]
        if any(isinstance(v, str | Path) and "\x00" in str(v) for v in items):
            raise ValueError("contains a NUL character")
        return value


class ProviderSettings(_Section):
    """The `provider` routing object sent with every request (docs/openrouter.md §2.2)."""

    ignore: list[str] = Field(default_factory=list)
    """Provider slugs never to route to (e.g. "deepinfra"); the console adds to this at run time."""
    only: list[str] | None = None
    """If set, route only to these provider slugs."""
    order: list[str] | None = None
    """If set, try these provider slugs first, in this order (disables load balancing)."""
    quantizations: list[Quantization] | None = None
    """If set, route only to endpoints serving one of these precisions (e.g. ["int4", "fp8"])."""
    sort: Literal["price", "throughput", "latency"] | None = "price"
    """Strict routing order by price, throughput or latency; empty for OpenRouter's balancing."""
    allow_fallbacks: bool = True
    """Let OpenRouter fall back to other allowed providers when the first one fails."""
    require_parameters: bool = False
    """Route only to endpoints that honour every sampling parameter sent."""
    data_collection: Literal["allow", "deny"] | None = None
    """"deny" keeps only providers that neither store nor train on prompts."""
    max_price: dict[str, float] | None = None
    """Price ceiling in USD per MILLION tokens, e.g. {prompt = 1, completion = 4}."""

    @field_validator("ignore", "only", "order")
    @classmethod
    def _lower(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else [slug.strip().lower() for slug in value]


class OpenRouterSettings(_Section):
    """How requests reach OpenRouter and what they ask for."""

    base_url: str = "https://openrouter.ai/api/v1"
    """API root; tests and `regen demo` point this at the simulator."""
    api_key: SecretStr | None = None
    """The API key. Prefer the OPENROUTER_API_KEY environment variable to writing it here."""
    model: str = "moonshotai/kimi-k2.5"
    """The model slug to generate with."""
    stream: bool = True
    """Stream responses (an aborted stream stops billing at providers that support it)."""
    max_tokens: int = Field(16384, ge=1, le=1 << 20)
    """Output token cap per response; always sent, and the basis of each request's reservation. Also SGLang's max_new_tokens: the sampling settings are the same for both backends."""
    temperature: float | None = Field(1.0, ge=0, le=2)
    """Sampling temperature; empty to leave it to the provider (SGLang too)."""
    top_p: float | None = Field(0.95, gt=0, le=1)
    """Nucleus sampling; empty to leave it to the provider (SGLang too)."""
    reasoning: dict[str, Any] | None = Field(default_factory=lambda: {"enabled": True})
    """The `reasoning` object; never set exclude = true, training needs the reasoning text."""
    provider: ProviderSettings = Field(default_factory=ProviderSettings)
    """Routing preferences."""
    native_precision: Quantization = "int4"
    """The model's native precision (Kimi K2.5: int4). With provider.quantizations empty, only this precision and finer are allowed."""
    precision_guard: bool = True
    """Send the precision allowlist, check every response's serving provider against it, and quarantine and exclude offenders."""
    fidelity: Literal["off", "warn", "exclude", "requeue"] = "warn"
    """What a route whose answers drift from the others' (or the GPU fleet's) gets (docs/fidelity.md): "warn" shows DRIFT and journals it; "exclude" also keeps it out, as the precision guard does; "requeue" also moves its rows to quarantine.jsonl, books their money as waste (fidelity) and sends their prompts again; "off" fingerprints nothing."""
    fidelity_alpha: float = Field(0.001, gt=0, lt=1)
    """The chance, over a whole run, that an honest route is flagged at all (shared over the statistics, the routes and every look)."""
    key_poll_interval_s: float = Field(30.0, gt=0, le=3600)
    """Seconds between reads of the key's credit (/key) during a run."""
    usage_settle_s: float = Field(10.0, ge=0, le=3600)
    """At the end of a run that drained, with requests cut before their generation id arrived: their
    worst case is bounded by what the key's usage (/key) grew by since the run's first start
    (docs/money.md). Bills reach /key late, by an amount OpenRouter does not document, so the usage
    must stay unchanged this many seconds first."""
    usage_settle_max_s: float = Field(60.0, ge=0, le=86400)
    """The longest the end of a run waits for the key's usage to settle; past it the worst case stays."""
    connect_timeout_s: float = Field(30.0, gt=0, le=3600)
    """Seconds to open a connection."""
    read_timeout_s: float = Field(300.0, gt=0, le=86400)
    """Seconds without a byte (keep-alive comments count) before an attempt is abandoned. Checked once a second (an eighth of the limit when shorter), so it fires at most that late."""
    request_timeout_s: float = Field(1800.0, gt=0, le=86400)
    """Seconds for a whole attempt, from sending the request to its last byte."""
    app_title: str = "regen"
    """Sent as X-Title for OpenRouter's app attribution."""


class SGLangSettings(_Section):
    """The SGLang backend (job.backend = "sglang"): the servers regen generates with, and how it launches them on the GPU hosts. Sampling comes from [openrouter] (max_tokens, temperature, top_p) and thinking from tokenizer.thinking, so both backends ask for the same thing (docs/sglang.md §11)."""

    urls: list[str] = Field(default_factory=list)
    """Servers the backend talks to directly, e.g. ["http://127.0.0.1:30000"]: a local server, an open tunnel or the router. Empty with [[hosts]] set: the run reaches each host's server through an SSH tunnel of its own, behind the SGLang router (smg) when there are several hosts."""
    port: int = Field(30000, ge=1, le=65535)
    """Port SGLang listens on, on the host's 127.0.0.1; a host's sglang_port overrides it."""
    served_model_name: str | None = None
    """--served-model-name at launch, one name for every server of the job whatever its model folder's path (the router and the rows name the model by it); empty for the first [[hosts]] model folder's name. The backend refuses a server that serves another name (with sglang.urls and this empty: servers that disagree)."""
    tp: int = Field(8, ge=1)
    """--tp at launch: GPUs per server. Also the GPUs a server counts for GPU time when it does not say (docs/money.md)."""
    launch_args: list[str] = Field(default_factory=list)
    """Further launch_server flags, e.g. ["--mem-fraction-static", "0.85"]. Refused: the flags regen passes itself, --incremental-streaming-output (0.5.9: --stream-output: each chunk would hold only what is new) and --log-level above info (it hides the startup lines regen follows)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment for the server process on the host."""
    work_dir: str | None = None
    """Folder on the host for the server's log and pid file; empty for regen-sglang under the remote user's home."""
    ready_timeout_s: float = Field(2700.0, gt=0)
    """Seconds a launch may take to be ready (a ~1T-parameter model takes 10 to 30 minutes)."""
    stop_grace_s: float = Field(30.0, gt=0)
    """Seconds between TERM to the server's process group and KILL, on regen sglang stop."""
    connect_timeout_s: float = Field(10.0, gt=0)
    """Seconds to open a connection to a server."""
    read_timeout_s: float = Field(600.0, gt=0)
    """Seconds without a byte, once the first chunk has come, before an attempt is abandoned (a retracted request waits in the queue again). The wait before the first chunk is bounded by request_timeout_s only: a queued request hears nothing until it runs."""
    request_timeout_s: float = Field(7200.0, gt=0)
    """Seconds for a whole attempt, from sending the request to its last byte (thinking outputs run to tens of thousands of tokens)."""
    metrics_interval_s: float = Field(2.0, gt=0)
    """Seconds between reads of every server's /metrics (queue, running, KV usage, throughput)."""
    healthy_queue_min: int = Field(100, ge=0)
    """Concurrency is raised while fewer requests than this wait in the servers' queues (and KV usage is healthy)."""
    healthy_queue_max: int = Field(2000, ge=1)
    """Concurrency is lowered while more requests than this wait in the servers' queues. The job also never keeps more in flight than the servers' running slots plus a quarter of them (at most this many) queued (docs/sglang.md §11.6)."""
    healthy_kv_usage_max: float = Field(0.95, gt=0, le=1)
    """Concurrency is lowered to a short queue while a server's KV token usage is at or above this, or while it retracts requests."""

    @field_validator("urls")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        cleaned = []
        for url in urls:
            url = url.strip().rstrip("/")
            scheme, _, rest = url.partition("://")
            if scheme not in ("http", "https") or not rest or "/" in rest:
                raise ValueError(f"{url!r} is not a server URL like http://127.0.0.1:30000")
            cleaned.append(url)
        return cleaned

    @field_validator("launch_args")
    @classmethod
    def _launch_args(cls, args: list[str]) -> list[str]:
        # regen passes these itself (docs/sglang.md §12); argparse takes a unique prefix as the flag.
        own = (
            "--model-path",
            "--model",
            "--host",
            "--port",
            "--tp-size",
            "--tensor-parallel-size",
            "--served-model-name",
        )
        for word in args:
            name = word.split("=", 1)[0]
            if name.startswith("--") and len(name) > 2 and any(flag.startswith(name) for flag in own):
                raise ValueError(
                    f"{word!r}: regen sets --model-path, --host, --port, --tp and --served-model-name itself "
                    "(from [[hosts]] model_path, sglang.port or sglang_port, sglang.tp, sglang.served_model_name)"
                )
        problem = launch_arg_problem(args)
        if problem is not None:
            raise ValueError(problem)
        return args

    @property
    def weight_version(self) -> str:
        """The weight version the servers are launched with: --weight-version in launch_args, else
        SGLang's own default ("default"); part of the model's identity (engine/host/identity.py)."""
        version = "default"
        for i, word in enumerate(self.launch_args):
            name, eq, value = word.partition("=")
            if name == "--weight-version":
                if eq:
                    version = value
                elif i + 1 < len(self.launch_args):
                    version = self.launch_args[i + 1]
        return version

    @model_validator(mode="after")
    def _queue_band(self) -> SGLangSettings:
        if self.healthy_queue_min >= self.healthy_queue_max:
            raise ValueError(
                f"healthy_queue_min ({self.healthy_queue_min}) must be below healthy_queue_max "
                f"({self.healthy_queue_max})"
            )
        return self


class JobSettings(_Section):
    """What to generate, how hard to push, and when to stop."""

    backend: Literal["openrouter", "sglang"] = "openrouter"
    """Where responses come from: "openrouter" (pay per token) or "sglang" (your GPUs, [sglang])."""
    backends: list[Literal["openrouter", "sglang"]] | None = None
    """Several backends in one job, in order of preference, e.g. ["sglang", "openrouter"]: the GPUs are kept full and OpenRouter takes what they cannot, within budget_usd (docs/architecture.md, "Lanes"). When set it wins over `backend`; empty for one backend."""
    datasets: list[Path] = Field(default_factory=list)
    """Dataset folders, each holding prompts.jsonl."""
    dataset_roots: list[Path] = Field(default_factory=list)
    """Folders whose subfolders holding prompts.jsonl are datasets."""
    run_dir: Path = Path("regen-run")
    """Where the job keeps its journals, lock and control socket."""
    concurrency: int = Field(2000, ge=1, le=20000)
    """Requests in flight at most."""
    backend_concurrency: dict[Literal["openrouter", "sglang"], Annotated[int, Field(ge=1, le=20000)]] = Field(
        default_factory=dict
    )
    """In a job with several backends, the in-flight limit of some of them, e.g. { sglang = 256 }; a backend not named here has `concurrency`."""
    adaptive_concurrency: bool = True
    """Back off under a 429/503 storm and climb back to `concurrency` once it passes."""
    min_concurrency: int = Field(8, ge=1)
    """Adaptive backoff never goes below this."""
    requests_per_minute: int | None = Field(None, ge=1)
    """Requests sent per minute at most (retries count); empty for no cap. A `:free` model is held to its platform limit of 20 either way."""
    max_attempts: int = Field(6, ge=1)
    """Attempts per prompt in one run before it is given up (a later run tries again)."""
    backoff_base_s: float = Field(1.0, gt=0, le=3600)
    """First retry delay bound; doubles each attempt, full jitter."""
    backoff_max_s: float = Field(60.0, gt=0, le=3600)
    """Largest retry delay bound."""
    budget_usd: float = Field(100.0, ge=0)
    """Hard dollar budget: spent + reserved for requests in flight never exceeds it."""
    dataset_token_budget: int | None = Field(None, ge=1)
    """Output tokens per dataset after which its dispatch stops; empty for no limit."""
    finish_reasons: dict[str, RowStatus] = Field(
        default_factory=lambda: dict[str, RowStatus](stop="ok", length="truncated")
    )
    """Finish reasons that finish a prompt, and the row status each one gives."""
    skip_invalid: bool = False
    """Skip (and journal) invalid prompt lines instead of refusing to start."""
    commit_interval_s: float = Field(0.005, ge=0, le=1)
    """How long writes gather before one fsync (group commit)."""
    checkpoint_interval_s: float = Field(300.0, ge=1, le=86400)
    """How often a running job checkpoints what a restart must rebuild (also at every start and clean stop), so a start reads only the journal records and rows written after the last checkpoint (docs/faults.md, "Checkpoints")."""
    journal_segment_mb: float = Field(64.0, gt=0, le=1_048_576)
    """How large (MB) the attempt journal grows before a checkpoint moves it into a compressed segment of the run folder's history that a start never reads, while the job runs or at a start (docs/faults.md, "Checkpoints")."""
    reconcile_timeout_s: float = Field(60.0, ge=0, le=86400)
    """How long to look up an estimated request's bill (/generation) before leaving it estimated, counted only while the backend is reachable; also the most the end of a drained run waits for the bills still coming (docs/money.md)."""
    outage_probe_s: float = Field(2.0, gt=0, le=60)
    """While a backend is unreachable (an outage), how often to ask whether it answers again, with a request that costs nothing (OpenRouter: GET /key; SGLang: /health_generate); its first answer sends the attempt that ends the outage (docs/faults.md)."""
    deadline: str | None = None
    """When the job should be done: a time of day ("06:30", its next occurrence) or a duration from the job's first start ("12h", "1h30m"); empty for none. With both backends OpenRouter's share is paced to finish by then at the least cost (docs/fleets.md). The resolved instant is journaled: a restart keeps it."""

    @field_validator("deadline")
    @classmethod
    def _deadline(cls, text: str | None) -> str | None:
        if text is None or not text.strip():
            return None
        try:
            parse_deadline(text)
        except DeadlineError as exc:
            raise ValueError(exc.detail) from None
        return text.strip()

    @field_validator("backends")
    @classmethod
    def _backends(cls, backends: list[str] | None) -> list[str] | None:
        if backends is None:
            return None
        if not backends:
            raise ValueError('names no backend: list one or more of "sglang", "openrouter", or leave it out')
        if len(set(backends)) != len(backends):
            raise ValueError(f"names a backend twice ({', '.join(backends)}): list each once")
        return backends

    @property
    def chosen_backends(self) -> list[str]:
        """The job's backends in order: `backends` when set, else the one `backend`."""
        return list(self.backends) if self.backends is not None else [self.backend]


class SteeringSettings(_Section):
    """The pacer of a job on both fleets: OpenRouter's share paced to the deadline (docs/fleets.md, "Pacing")."""

    gpu_tokens_per_s: float | None = Field(None, gt=0)
    """The GPU fleet's output tokens/s, planned with until the job has measured it; empty: unknown (the plan before the start counts the GPUs as making nothing)."""
    request_tokens_per_s: float = Field(30.0, gt=0)
    """One OpenRouter request's output tokens/s (time to the first token included), planned with until measured."""
    interval_s: float = Field(5.0, gt=0, le=3600)
    """How often the pacer re-plans and sets OpenRouter's in-flight ceiling."""
    smoothing_s: float = Field(60.0, gt=0, le=86400)
    """Time constant of the measured rates' moving averages."""
    margin: float = Field(0.05, ge=0, lt=1)
    """Share of the time left the target finish sits before the deadline."""
    deadband: float = Field(0.05, ge=0, le=1)
    """Relative change a new ceiling must make to be applied (noise is not news)."""


class TokenizerSettings(_Section):
    """The target model's tokenizer, which turns finished rows into the token ids drafters train on."""

    path: Path | None = None
    """Local folder holding the tokenizer files (pulled from the GPU host or downloaded by hand); empty for the workspace's (what `regen pull` brought), else output_ids stay empty. SGLang, which is sent the prompts as token ids, needs one: with it empty and [[hosts]] set, `regen run` fetches the files from a host's model folder into the workspace itself (inspect, pull, push and sglang never need it)."""
    name: str | None = None
    """Name recorded in every row (e.g. "moonshotai/Kimi-K2.5"); defaults to the folder name."""
    trust_remote_code: bool = False
    """Allow the tokenizer's own Python code to run (Kimi's tokenizer needs it); off unless you trust the files."""
    thinking: bool = True
    """The chat template's thinking switch (Kimi's `thinking` keyword), matching how responses were generated. With SGLang it is what the prompts ask for."""
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Further keyword arguments for the chat template."""
    end_of_turn: str = "<|im_end|>"
    """The end-of-turn token, by name: appended to output_ids of rows the model finished."""
    workers: int = Field(2, ge=1, le=64)
    """Processes that tokenize rows beside the job's loop."""


class StatsSettings(_Section):
    """Per-provider statistics and the status words they give."""

    window_s: float = Field(60.0, gt=0)
    """Sliding window for per-provider rates and percentiles."""
    fail_error_share: float = Field(0.5, gt=0, le=1)
    """A provider is FAIL when this share of its recent attempts failed."""
    slow_factor: float = Field(2.0, gt=1)
    """A provider is SLOW when its median latency is this many times the typical provider's."""
    expected_output_tokens: int = Field(2000, ge=1)
    """Output tokens per prompt the budget planner assumes until finished rows measure it (never more than openrouter.max_tokens)."""


class ConsoleSettings(_Section):
    """The console: looks, keys and pace (flags on the command line win over these)."""

    theme: str = "regen-dark"
    """Theme to start with: regen-dark, regen-light, regen-contrast, or a name from theme_dirs."""
    theme_dirs: list[Path] = Field(default_factory=list)
    """Extra folders of *.toml theme files."""
    keymap: dict[str, str] = Field(default_factory=dict)
    """Binding id to comma-separated keys, e.g. { pause = "P", freeze = "F,ctrl+f" }; ? lists the ids."""
    mouse: bool = True
    """Mouse reporting; off is kinder to slow SSH links (--no-mouse)."""
    fps: int | None = Field(None, ge=1)
    """Screen updates per second at most (--fps); empty for Textual's default."""
    export_dir: Path | None = None
    """Where `e` writes snapshot files; empty for the run folder."""
    stale_after_s: float = Field(5.0, gt=0)
    """Data older than this shows its age in the warning colour."""
    repaint_interval_s: float = Field(0.5, ge=0)
    """Panes repaint at most this often (the newest snapshot wins)."""
    log_max_lines: int = Field(2000, ge=10)
    """Lines the log pane keeps."""
    concurrency_step: float = Field(0.1, gt=0, le=1)
    """`+` and `-` change the concurrency by this fraction."""
    budget_warn_fraction: float = Field(0.8, gt=0, le=1)
    """Spent plus reserved above this fraction of the budget shows in the warning colour."""


class HeadlessSettings(_Section):
    """The status line of `--headless` runs."""

    status_interval_s: float = Field(5.0, gt=0, le=3600)
    """Seconds between status lines."""


_HOSTNAME = re.compile(
    r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
LOOPBACK = "127.0.0.1"


def listen_address(text: str) -> tuple[str, int]:
    """ "HOST:PORT", "[IPv6]:PORT", or a bare "PORT" (or ":PORT") on loopback: the host and port to
    listen on. Raises ValueError, in the operator's words, for anything else."""
    text = text.strip()
    shape = f"{text!r} is not an address to listen on like 127.0.0.1:9464 (or a port alone, on loopback)"
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(shape) from None
    elif ":" in host:
        if "/" in host:  # a URL, not an address
            raise ValueError(shape)
        raise ValueError(f"{text!r}: an IPv6 address goes in brackets, like [::1]:9464")
    elif host and not _HOSTNAME.match(host):
        raise ValueError(shape)
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(shape if not port.isdigit() else f"{text!r}: the port must be 1-65535")
    return host or LOOPBACK, int(port)


class MetricsSettings(_Section):
    """Prometheus metrics served by the job process at /metrics (docs/metrics.md); off unless `listen` is set."""

    listen: str | None = None
    """Address the job serves /metrics on, like "127.0.0.1:9464"; a port alone listens on loopback only. Give an explicit address (e.g. "0.0.0.0:9464") to let other machines scrape it. Empty: no metrics, no port opened."""

    @field_validator("listen")
    @classmethod
    def _listen(cls, listen: str | None) -> str | None:
        if listen is None or not listen.strip():
            return None
        host, port = listen_address(listen)
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def address(self) -> tuple[str, int] | None:
        """Where to listen; None: metrics are off."""
        return None if self.listen is None else listen_address(self.listen)


class HostSettings(_Section):
    """A GPU host reached over SSH (docs/gpu-host.md): where its datasets and model live."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """A short name for the host (letters, digits, . _ -), used by --host and in the console."""
    address: str = Field(min_length=1)
    """Host name or IP address to connect to."""
    port: int = Field(22, ge=1, le=65535)
    """SSH port."""
    user: str | None = None
    """Login name; empty for the local user's name."""
    key_files: list[Path] = Field(default_factory=list)
    """Private key files to offer; empty for the SSH agent and the default keys (~/.ssh/id_ed25519, id_ecdsa, id_rsa)."""
    known_hosts: Path | None = None
    """The known_hosts file that host keys are verified against; empty for ~/.ssh/known_hosts. Verification cannot be turned off."""
    data_root: str = Field(min_length=1)
    """Folder on the host whose subfolders holding prompts.jsonl are datasets (~ is the login's home)."""
    model_path: str | None = None
    """The model folder on the host that SGLang loads, holding config.json and the tokenizer files."""
    python: str = "python3"
    """The Python interpreter on the host (3.10 or newer) for regen's scripts: a command or path, split as a shell would (quote a path with spaces)."""
    sglang_port: int | None = Field(None, ge=1, le=65535)
    """Port of SGLang on this host; empty for sglang.port."""
    poll_interval_s: float = Field(10.0, gt=0)
    """Seconds between the console's polls of GPUs and disk (each poll starts when the last one ended)."""
    connect_timeout_s: float = Field(15.0, gt=0)
    """Seconds to open the SSH connection and log in."""


# Slurm's --time forms: minutes, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or UNLIMITED.
_SLURM_TIME = re.compile(r"^(UNLIMITED|INFINITE|\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2})$")


class ClusterSettings(_Section):
    """GPU nodes from a cluster manager (docs/clusters.md): one SGLang server per node, started by one batch job, reached from this machine over the cluster's network. regen runs where the cluster's commands work (a login node) and the nodes mount work_dir and model_path at the same paths."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """A short name for the cluster (letters, digits, . _ -), used by --cluster and in the console."""
    kind: Literal["slurm"] = "slurm"
    """The cluster manager: "slurm" (sbatch, squeue, scancel on this machine's PATH)."""
    partition: str | None = Field(None, min_length=1)
    """Slurm partition (sbatch --partition); empty for the cluster's default partition."""
    nodes: int = Field(1, ge=1, le=4096)
    """Nodes to run servers on, one SGLang server per node."""
    gpus_per_node: int = Field(8, ge=0, le=64)
    """GPUs asked for on each node (--gres=gpu:N); 0 asks for none (a cluster without GPU GRES, or whole nodes given by the partition). sglang.tp must fit in it."""
    time_limit: str = "1-00:00:00"
    """The job's time limit, in Slurm's forms (minutes, H:M:S, D-H:M:S)."""
    account: str | None = Field(None, min_length=1)
    """Slurm account to charge (sbatch --account); empty for the user's default."""
    qos: str | None = Field(None, min_length=1)
    """Slurm QOS (sbatch --qos); empty for the default."""
    allocation: str | None = Field(None, pattern=r"^\d+$")
    """An allocation you already hold (its job id, e.g. from salloc): the servers run as srun steps inside it, nothing is submitted; empty to submit a batch job."""
    sbatch_args: list[str] = Field(default_factory=list)
    """More sbatch options, one per entry, each written as an #SBATCH line (e.g. "--constraint=h100", "--exclusive")."""
    model_path: str = Field(min_length=1)
    """The model folder on the shared filesystem, the same path on every node and on this machine."""
    work_dir: Path
    """Folder on the shared filesystem for the batch script, each node's state file and server log (relative to the settings file)."""
    python: str = "python3"
    """The Python interpreter on the nodes (3.10 or newer) that runs regen's node script and sglang: a command or path."""
    port: int | None = Field(None, ge=1, le=65535)
    """The first port a node's server tries (the next free one above it is taken when it is in use); empty for sglang.port."""

    @field_validator("time_limit")
    @classmethod
    def _slurm_time(cls, value: str) -> str:
        if not _SLURM_TIME.match(value):
            raise ValueError(
                f'{value!r} is not a Slurm time (minutes, H:M:S or D-H:M:S, e.g. "12:00:00" or "2-00:00:00")'
            )
        return value

    @field_validator("work_dir")
    @classmethod
    def _one_word(cls, path: Path) -> Path:
        # The batch script's #SBATCH --output names a file under it, and sbatch splits those lines at spaces.
        if any(c.isspace() for c in str(path)):
            raise ValueError(
                f"{str(path)!r} holds a space or a line break: sbatch cannot take it in an #SBATCH line"
            )
        return path

    @field_validator("sbatch_args")
    @classmethod
    def _sbatch_options(cls, args: list[str]) -> list[str]:
        for arg in args:
            if not arg.startswith("-") or any(c in arg for c in "\r\n"):
                raise ValueError(f"{arg!r} is not one sbatch option (one per entry, starting with -)")
        return args


class Settings(BaseSettings):
    """All of regen's settings."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        use_attribute_docstrings=True,
        validate_default=True,
    )

    openrouter: OpenRouterSettings = Field(default_factory=OpenRouterSettings)
    """The OpenRouter backend."""
    sglang: SGLangSettings = Field(default_factory=SGLangSettings)
    """The SGLang backend."""
    job: JobSettings = Field(default_factory=JobSettings)
    steering: SteeringSettings = Field(default_factory=SteeringSettings)
    """The generation job."""
    stats: StatsSettings = Field(default_factory=StatsSettings)
    """Statistics and planning."""
    tokenizer: TokenizerSettings = Field(default_factory=TokenizerSettings)
    """The target model's tokenizer."""
    console: ConsoleSettings = Field(default_factory=ConsoleSettings)
    """The console."""
    headless: HeadlessSettings = Field(default_factory=HeadlessSettings)
    """Headless output."""
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    """Prometheus metrics."""
    hosts: list[HostSettings] = Field(default_factory=list)
    """GPU hosts over SSH, one [[hosts]] table each (`regen inspect`, `regen pull`, `regen push`)."""
    clusters: list[ClusterSettings] = Field(default_factory=list)
    """GPU nodes from a cluster manager, one [[clusters]] table each (`regen sglang start --cluster NAME`)."""
    workspace: Path = Path("regen-data")
    """Local folder `regen pull` fills: datasets/<name>/prompts.jsonl and tokenizer/."""

    @property
    def expected_output_tokens(self) -> int:
        """Output tokens per prompt the plans assume until rows measure it: the setting, capped at
        max_tokens, since no answer is longer than the cap every request carries (a 2000-token guess
        for 64-token answers had the deadline plan call for 30 times the work, docs/fleets.md)."""
        return min(self.stats.expected_output_tokens, self.openrouter.max_tokens)

    @field_validator("hosts")
    @classmethod
    def _unique_host_names(cls, hosts: list[HostSettings]) -> list[HostSettings]:
        names = [h.name for h in hosts]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(
                f"host name {', '.join(map(repr, twice))} is used by more than one [[hosts]] table"
            )
        return hosts

    @model_validator(mode="after")
    def _fleet_tables(self) -> Settings:
        # A cluster's node servers and the hosts share the console's and the router's names.
        names = [c.name for c in self.clusters]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(
                f"cluster name {', '.join(map(repr, twice))} is used by more than one [[clusters]] table"
            )
        both = sorted(set(names) & {h.name for h in self.hosts})
        if both:
            raise ValueError(f"{', '.join(map(repr, both))} names both a [[hosts]] and a [[clusters]] table")
        for cluster in self.clusters:
            if cluster.gpus_per_node and self.sglang.tp > cluster.gpus_per_node:
                raise ValueError(
                    f"cluster {cluster.name}: sglang.tp is {self.sglang.tp} but gpus_per_node is "
                    f"{cluster.gpus_per_node}: one node's server must fit on its node"
                )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The file's values arrive as init kwargs; the environment must win over them.
        return (env_settings, init_settings)


def served_model_name(sglang: SGLangSettings, hosts: Sequence[HostSettings | ClusterSettings]) -> str | None:
    """The one --served-model-name of every server of the job: sglang.served_model_name, else the
    name of the first [[hosts]] model folder (hosts may mount it at different paths, docs/gpu-host.md,
    "One model"); None with neither (servers given as sglang.urls name it themselves)."""
    if sglang.served_model_name:
        return sglang.served_model_name
    for host in hosts:
        if host.model_path:
            name = PurePosixPath(host.model_path.rstrip("/")).name
            if name and name not in (".", "..", "~"):
                return name
    return None
