"""Build the statefleet image from its Dockerfile with buildah (no container daemon).

    python -m tools.image_build [--bases auto|public|local] [--tag statefleet:0.1.0]

The Dockerfile's base images are build arguments (PYTHON_IMAGE, MAVEN_IMAGE) that default
to public images on Docker Hub. ``--bases public`` builds on those; ``--bases local``
first builds two stand-ins from Debian bookworm packages with mmdebstrap (a Python 3.11
base, and a Java 17 + Maven base for the jar stage) and passes them instead, so the same
Dockerfile builds both ways; ``auto`` (default) uses the public bases when they can be
pulled and the local ones otherwise.

Everything is cached: a local base is named after a hash of its inputs (suite, packages,
the host's extra CA certificates) and rebuilt only when they change; the build runs with
``--layers``, so unchanged steps are reused; pip's downloads go to a build cache mount and
the host's Maven repository (~/.m2) is mounted into the jar stage. An image whose inputs
(the Dockerfile, every file of the build context, the build arguments and the bases' IDs)
are those of an image in the store is not built again: buildah's check of its cached
layers alone took 21 s and 23 CPU-seconds (it hashes what each ``COPY --from`` copies, the
whole virtualenv), and `make test` asks for the image three times.

Settings (environment):
  STATEFLEET_IMAGE_STORAGE_ROOT    the image store (default /var/lib/containers/statefleet;
                                   `podman --root /var/lib/containers/statefleet images`)
  STATEFLEET_IMAGE_STORAGE_DRIVER  its driver: overlay (default), or vfs where overlay
                                   mounts are refused (vfs copies every layer: several
                                   times slower to build, ~30 s to start each container)
  STATEFLEET_IMAGE_CA_DIR          extra CA certificates (*.crt) the local bases trust, so
                                   that apt, pip and Maven work behind a TLS-inspecting
                                   proxy (default /usr/local/share/ca-certificates; empty:
                                   none). An image built on local bases trusts them too.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tools import background

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TAG = "statefleet:0.1.0"
SUITE = "bookworm"
# The project's own image store: its layer cache outlives clones (CI builds from a fresh one)
# and never meets other containers' storage settings.
DEFAULT_STORAGE_ROOT = "/var/lib/containers/statefleet"
# Bump when the way a local base is made changes, so that cached bases are rebuilt.
RECIPE_VERSION = "1"


@dataclass(frozen=True)
class LocalBase:
    """A stand-in for a public base image, made from Debian packages."""

    name: str
    build_arg: str
    packages: tuple[str, ...]
    env: tuple[str, ...]
    cmd: str

    def tag(self, ca_files: list[Path]) -> str:
        digest = hashlib.sha256()
        for part in (RECIPE_VERSION, SUITE, *self.packages, *self.env, self.cmd):
            digest.update(part.encode() + b"\0")
        for ca in ca_files:
            digest.update(ca.name.encode() + b"\0" + ca.read_bytes())
        return f"localhost/statefleet-base-{self.name}:{SUITE}-{digest.hexdigest()[:12]}"


PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LOCAL_BASES = (
    # python:3.11-slim-bookworm: `python` on PATH, venv, CA certificates.
    LocalBase(
        "python",
        "PYTHON_IMAGE",
        ("python3", "python3-venv", "python-is-python3", "ca-certificates"),
        (PATH_ENV, "LANG=C.UTF-8"),
        "python",
    ),
    # maven:3.9-eclipse-temurin-17: a JDK 17 and `mvn` on PATH.
    LocalBase(
        "maven",
        "MAVEN_IMAGE",
        ("openjdk-17-jdk-headless", "maven", "ca-certificates", "ca-certificates-java"),
        (PATH_ENV, "LANG=C.UTF-8", "JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64"),
        "mvn",
    ),
)


def log(message: str) -> None:
    print(f"image: {message}", flush=True)


def storage_args() -> list[str]:
    """The image store buildah builds into and podman runs from (tests/image/container.py)."""
    root = os.environ.get("STATEFLEET_IMAGE_STORAGE_ROOT", DEFAULT_STORAGE_ROOT)
    # Its run-time state (locks, mounts) apart from the default store's as well.
    runroot = "/run/containers/" + (root.rstrip("/").rsplit("/", 1)[-1] or "statefleet")
    return [
        "--storage-driver",
        os.environ.get("STATEFLEET_IMAGE_STORAGE_DRIVER", "overlay"),
        "--root",
        root,
        "--runroot",
        runroot,
    ]


def build_lock() -> Path:
    """Held while an image is built into the store: a second build waits for the first."""
    args = storage_args()
    return Path(args[args.index("--runroot") + 1] + ".build.lock")


def buildah(*args: str, capture: bool = False, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["buildah", *storage_args(), *args], check=check, text=True, stdout=subprocess.PIPE if capture else None
    )


def image_exists(ref: str) -> bool:
    done = subprocess.run(
        ["buildah", *storage_args(), "inspect", "--type", "image", ref], text=True, capture_output=True, check=False
    )
    return done.returncode == 0


def require_tools(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        raise SystemExit(f"image: {', '.join(missing)} not found: install it (Debian: apt-get install {' '.join(missing)})")
    if os.geteuid() != 0:
        raise SystemExit("image: buildah builds here as root (chroot isolation, no daemon): run as root")


def dockerfile_default(arg: str) -> str:
    for line in (REPO / "Dockerfile").read_text().splitlines():
        if line.startswith(f"ARG {arg}="):
            return line.split("=", 1)[1].strip()
    raise SystemExit(f"image: the Dockerfile declares no default for ARG {arg}")


def ca_files() -> list[Path]:
    """The host's extra CA certificates, which the local bases trust (none when the setting is empty)."""
    setting = os.environ.get("STATEFLEET_IMAGE_CA_DIR", "/usr/local/share/ca-certificates")
    return sorted(Path(setting).glob("*.crt")) if setting and Path(setting).is_dir() else []


def build_local_base(base: LocalBase, cas: list[Path]) -> str:
    """The base's image, built from Debian packages unless one with the same inputs exists."""
    ref = base.tag(cas)
    if image_exists(ref):
        log(f"local base {ref} is up to date")
        return ref
    require_tools("mmdebstrap")
    log(f"building local base {ref} from Debian {SUITE}: {' '.join(base.packages)} (mmdebstrap, about a minute)")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="statefleet-base-") as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        command = ["mmdebstrap", "--variant=minbase", f"--include={','.join(base.packages)}"]
        if cas:
            # Before any package is installed, so that ca-certificates(-java) take them in.
            ca_src = " ".join(f"'{ca}'" for ca in cas)
            command.append(
                f'--setup-hook=mkdir -p "$1/usr/local/share/ca-certificates" && cp {ca_src} "$1/usr/local/share/ca-certificates/"'
            )
        command += ['--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin', SUITE, str(rootfs)]
        subprocess.run(command, check=True)
        container = buildah("from", "scratch", capture=True).stdout.strip()
        try:
            buildah("add", "--quiet", container, str(rootfs), "/")
            config = ["config", "--cmd", base.cmd, "--label", f"io.statefleet.base.packages={' '.join(base.packages)}"]
            for env in base.env:
                config += ["--env", env]
            buildah(*config, container)
            buildah("commit", "--quiet", "--rm", container, ref, capture=True)
        except BaseException:
            buildah("rm", container, capture=True, check=False)
            raise
    log(f"local base {ref} built in {time.monotonic() - started:.0f}s")
    return ref


def public_bases_available(refs: list[str], timeout: float) -> bool:
    for ref in refs:
        if image_exists(ref):
            continue
        log(f"pulling {ref} (up to {timeout:.0f}s)")
        try:
            done = subprocess.run(
                ["buildah", *storage_args(), "pull", "--quiet", ref], timeout=timeout, text=True, capture_output=True
            )
        except subprocess.TimeoutExpired:
            log(f"{ref} could not be pulled within {timeout:.0f}s")
            return False
        if done.returncode != 0:
            log(f"{ref} cannot be pulled: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
            return False
    return True


def choose_bases(mode: str, pull_timeout: float) -> dict[str, str]:
    """Build arguments for the base images: {} keeps the Dockerfile's public defaults."""
    public = [dockerfile_default(b.build_arg) for b in LOCAL_BASES]
    if mode == "public" or (mode == "auto" and public_bases_available(public, pull_timeout)):
        log(f"building on the public bases {', '.join(public)}")
        return {}
    if mode == "auto":
        log("the public bases cannot be pulled: building on local bases made from Debian packages")
    cas = ca_files()
    return {b.build_arg: build_local_base(b, cas) for b in LOCAL_BASES}


def build_command(tag: str, build_args: dict[str, str], m2: Path | None, iidfile: Path | None = None) -> list[str]:
    # Docker's image format: OCI's has no SHELL, and the Dockerfile's RUN steps use bash with pipefail.
    command = [
        "buildah",
        *storage_args(),
        "build",
        "--layers",
        "--format",
        "docker",
        "--isolation",
        "chroot",
        "--network",
        "host",
        "--file",
        str(REPO / "Dockerfile"),
        "--tag",
        tag,
    ]
    if iidfile is not None:
        # The image's ID: what this clone built, even if another build retags the name meanwhile.
        command += ["--iidfile", str(iidfile)]
    for name, value in sorted(build_args.items()):
        command += ["--build-arg", f"{name}={value}"]
    if m2 is not None:
        # The host's Maven repository for the jar stage (read and written; never part of a layer).
        command += ["--volume", f"{m2}:/root/.m2:rw"]
    return [*command, str(REPO)]


def context_files(repo: Path = REPO) -> list[Path] | None:
    """The files of the build context, from a ``.dockerignore`` of the form this one has: ``*``,
    then the entries let back in (``!services/``), then names left out anywhere
    (``**/__pycache__``, ``**/*.pyc``). None for any other form, which ``inputs_digest`` then
    does not try to follow (the image is always built)."""
    patterns = [line.strip() for line in (repo / ".dockerignore").read_text().splitlines()]
    patterns = [p for p in patterns if p and not p.startswith("#")]
    if patterns[:1] != ["*"]:
        return None
    rest = patterns[1:]
    let_in = [p[1:].rstrip("/") for p in itertools.takewhile(lambda p: p.startswith("!"), rest)]
    left_out = [p[3:] for p in rest[len(let_in) :]]
    if not all(p.startswith("**/") and "/" not in p[3:] for p in rest[len(let_in) :]):
        return None
    if any(set(entry) & set("*?[\\") or entry.startswith("/") or ".." in entry for entry in let_in):
        return None

    def kept(name: str) -> bool:
        return not any(fnmatch.fnmatchcase(name, pattern) for pattern in left_out)

    files: list[Path] = []
    for entry in let_in:
        top = repo / entry
        if top.is_file() or top.is_symlink():
            files.append(top)
        for folder, subfolders, names in os.walk(top):
            subfolders[:] = [d for d in subfolders if kept(d)]
            files += [Path(folder, name) for name in names if kept(name)]
    return sorted(set(files))


def inputs_digest(build_args: dict[str, str], repo: Path = REPO) -> str | None:
    """What the image is built from: the Dockerfile, each file of the context (its path, content
    and executable bits), the build arguments and the image ID of each base. None when the
    context cannot be listed (``context_files``) or a base is not in the store."""
    files = context_files(repo)
    if files is None:
        return None
    digest = hashlib.sha256()
    for part in (repo / "Dockerfile", repo / ".dockerignore"):
        digest.update(part.read_bytes() + b"\0")
    for name, value in sorted(build_args.items()):
        digest.update(f"arg {name}={value}\0".encode())
    for base in LOCAL_BASES:
        ref = build_args.get(base.build_arg) or dockerfile_default(base.build_arg)
        base_id = image_id(ref)
        if base_id is None:
            return None
        digest.update(f"base {ref} {base_id}\0".encode())
    for file in files:
        relative = file.relative_to(repo).as_posix()
        if file.is_symlink():
            digest.update(f"link {relative} {os.readlink(file)}\0".encode())
            continue
        executable = os.stat(file).st_mode & 0o111
        digest.update(f"file {relative} {executable:o} {file.stat().st_size}\0".encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()


def image_id(ref: str) -> str | None:
    done = subprocess.run(
        ["buildah", *storage_args(), "inspect", "--type", "image", "--format", "{{.FromImageID}}", ref],
        text=True,
        capture_output=True,
        check=False,
    )
    if done.returncode != 0 or not done.stdout.strip():
        return None
    return done.stdout.strip()


def built_images_file() -> Path:
    """Which inputs (``inputs_digest``) each image of the store was built from; kept in the store
    itself, so that it goes with the images it names."""
    args = storage_args()
    return Path(args[args.index("--root") + 1]) / "statefleet-built-images.json"


def built_images() -> dict[str, str]:
    try:
        recorded = json.loads(built_images_file().read_text())
    except (OSError, ValueError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


def record_built_image(inputs: str, image: str) -> None:
    """Keeps the last ``BUILT_IMAGES_KEPT`` records."""
    recorded = {k: v for k, v in built_images().items() if k != inputs}
    recorded[inputs] = image
    kept = dict(list(recorded.items())[-BUILT_IMAGES_KEPT:])
    path = built_images_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(kept, indent=1))
    partial.replace(path)


BUILT_IMAGES_KEPT = 20


def image_size(ref: str) -> str:
    """The image's size as buildah reports it (uncompressed, e.g. "1.52 GB")."""
    images = json.loads(buildah("images", "--json", ref, capture=True).stdout)
    return str(images[0]["size"]) if images else "?"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tag", default=os.environ.get("STATEFLEET_IMAGE", DEFAULT_TAG), help="the image's name")
    parser.add_argument(
        "--bases",
        choices=("auto", "public", "local"),
        default="auto",
        help="public Docker Hub bases, local Debian-built bases, or public when they can be pulled",
    )
    parser.add_argument("--pull-timeout", type=float, default=60.0, help="seconds to try pulling each public base")
    parser.add_argument(
        "--iidfile",
        type=Path,
        default=REPO / ".local" / "image-id",
        help="file that receives the built image's ID (make image-check runs that image)",
    )
    parser.add_argument(
        "--background",
        action="store_true",
        help="build in a process of its own at the lowest CPU and I/O priority, and return (make test starts it first)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.background:
        if shutil.which("buildah") is not None:
            forwarded = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--background"]
            log_file = REPO / ".local" / "image-build.log"
            pid = background.start_at_lowest_priority(["tools.image_build", *forwarded], log_file)
            log(f"building {args.tag} in the background (pid {pid}, lowest priority; log: {log_file})")
        return
    require_tools("buildah")
    with background.exclusive(build_lock(), "image build", log):
        build(args)


def build(args: argparse.Namespace) -> None:
    started = time.monotonic()
    build_args = choose_bases(args.bases, args.pull_timeout)
    m2 = Path.home() / ".m2"
    m2.mkdir(exist_ok=True)
    args.iidfile.parent.mkdir(parents=True, exist_ok=True)
    inputs = inputs_digest(build_args)
    built = built_images().get(inputs) if inputs else None
    if built is not None and image_id(built) == built:
        buildah("tag", built, args.tag)
        args.iidfile.write_text(f"sha256:{built}")
        log(
            f"{args.tag} is up to date ({built[:12]}: built from this Dockerfile, context and bases); "
            f"{time.monotonic() - started:.0f}s"
        )
        return
    command = build_command(args.tag, build_args, m2, args.iidfile)
    log("building " + args.tag + ": " + " ".join(command))
    build_started = time.monotonic()
    done = subprocess.run(command)
    if done.returncode != 0:
        raise SystemExit(f"image: the build of {args.tag} failed (exit {done.returncode}); its output is above")
    new_id = args.iidfile.read_text().strip().removeprefix("sha256:")
    if inputs is not None and inputs_digest(build_args) == inputs:  # nothing changed while it built
        record_built_image(inputs, new_id)
    size = image_size(args.tag)
    log(
        f"built {args.tag} ({args.iidfile.read_text().strip()[:19]}): {size}; build {time.monotonic() - build_started:.0f}s, "
        f"{time.monotonic() - started:.0f}s in all"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
