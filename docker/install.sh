#!/usr/bin/env bash
# The project's install steps, one script for the image (docker/Dockerfile runs it at build
# time) and for a GPU machine without Docker (python -m tts_tools.gpu_bundle install runs it
# offline from the bundle's wheels): a venv with the hashed lock for the profile, the project
# on its path, and the voice exported into the model repository.
#
#   docker/install.sh [--profile cpu|gpu|gpu-host-torch] [--venv DIR] [--python PY]
#                     [--wheels DIR] [--triton] [--no-export] [--only dependencies|project]
#
# cpu: requirements/image-cpu.lock (ONNX Runtime); gpu: image-gpu.lock (the same plus torch,
# the one pin of requirements/torch.txt); gpu-host-torch: the cpu lock, torch being the
# machine's own. --wheels: install offline from that folder. --triton: Triton itself too, from
# nvidia-pytriton (requirements/image-triton.lock), for a base that has none (the CPU image on
# Debian). The locks are made for Python 3.12 on x86-64 glibc (the NGC Triton image's) and hold
# every wheel's hash of each pinned version, so Debian 12's Python 3.11 installs them as well
# (tests/deployment/test_image.py resolves them for both); `make lock` writes them.
# --only dependencies: the venv and its locks (the image's layer that changes with the locks
# only); --only project: the project's steps on a venv that has them (its path, the export).
set -euo pipefail
project="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
profile=cpu venv=/opt/tts/venv python=python3 wheels="" export_voice=1 triton=0 only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="$2"; shift 2 ;;
    --venv) venv="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    --wheels) wheels="$2"; shift 2 ;;
    --no-export) export_voice=0; shift ;;
    --triton) triton=1; shift ;;
    --only) only="$2"; shift 2 ;;
    *) echo "install.sh: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
case "$profile" in
  cpu | gpu-host-torch) lock="$project/requirements/image-cpu.lock" ;;
  gpu) lock="$project/requirements/image-gpu.lock" ;;
  *) echo "install.sh: --profile must be cpu, gpu or gpu-host-torch, not '$profile'" >&2; exit 2 ;;
esac
case "$only" in
  "" | dependencies | project) ;;
  *) echo "install.sh: --only must be dependencies or project, not '$only'" >&2; exit 2 ;;
esac

dependencies() {
  echo "install.sh: $profile profile into $venv from $(basename "$lock")${wheels:+ (offline: $wheels)}"
  if [ ! -x "$venv/bin/python" ]; then
    # Without ensurepip (a distribution's python3 lacking its venv package) the venv gets no pip
    # of its own and the outer pip installs into it.
    "$python" -m venv "$venv" 2>/dev/null || { rm -rf "$venv"; "$python" -m venv --without-pip "$venv"; }
  fi
  local pip install
  if "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    pip=("$venv/bin/python" -m pip)
  else
    pip=("$python" -m pip --python "$venv/bin/python")
  fi
  # Every package pinned with its hashes, wheels only: nothing is built and nothing else comes in.
  install=("${pip[@]}" install --no-cache-dir --disable-pip-version-check --require-hashes
           --only-binary=:all: --no-deps)
  if [ -n "$wheels" ]; then install+=(--no-index --find-links "$wheels"); fi
  "${install[@]}" -r "$lock"
  # Triton's server alone: its Python API's dependencies are not needed to run the binary.
  if [ "$triton" = 1 ]; then "${install[@]}" -r "$project/requirements/image-triton.lock"; fi
}

on_path() {
  # The project runs from its folder (no build step, so offline works too): its three import
  # roots go on the venv's path, written with the dependencies too (an image copies that venv
  # into its last stage before the project's files change).
  local site
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  printf '%s\n' "$project" "$project/client" "$project/wire" > "$site/tts_project.pth"
}

if [ "$only" != project ]; then dependencies; fi
on_path
if [ "$export_voice" = 1 ] && [ "$only" != dependencies ]; then
  (cd "$project" && "$venv/bin/python" -m export --repository model_repository)
fi
echo "install.sh: done"
