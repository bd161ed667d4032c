#!/usr/bin/env bash
# Installs the Debian packages relgrad builds with, and nothing when they are all present.
set -euo pipefail

# clang-14, libclang-rt-14-dev (libFuzzer and clang's sanitizer runtimes) and libomp-14-dev
# (clang's OpenMP, which find_package(OpenMP) needs under clang) build the fuzzers of tests/fuzz/.
# libopenmpi-dev and openmpi-bin: training on several processes (docs/distributed.md).
# libcpp-httplib-dev and pkg-config (its build flags): the explorer's server (its charts are its
# own SVG); chromium, chromium-driver and python3-selenium: its tests in a headless browser
# (docs/explorer.md).
packages=(g++ cmake make libxtensor-dev libxtensor-blas-dev libxsimd-dev libopenblas-dev doctest-dev
          nlohmann-json3-dev libcli11-dev python3-torch python3-numpy
          pybind11-dev python3-dev python3-pytest graphviz jupyter-nbconvert python3-nbclient python3-ipykernel
          python3-matplotlib libdnnl-dev
          clang-14 libclang-rt-14-dev libomp-14-dev
          libopenmpi-dev openmpi-bin
          libcpp-httplib-dev pkg-config chromium chromium-driver python3-selenium)

missing=()
for package in "${packages[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "installing: ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo="sudo"
fi
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
