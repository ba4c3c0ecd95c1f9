# Sourced by engine.sh, demo.sh and test.sh: installs missing packages, puts nvcc on
# PATH and configures the build directory ($BUILD_DIR, default build).
bash scripts/install_deps.sh
export PATH="/usr/local/cuda/bin:$PATH"
BUILD_DIR="${BUILD_DIR:-build}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release
