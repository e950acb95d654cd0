# Sourced by scripts/gpu_check.sh --prebuilt: makes a bundle of scripts/gpu_bundle.sh ready to run on
# this machine (docs/gpu_first_run.md). prepare_bundle DIR WORK_DIR
#   1. finds the bundle tree: DIR itself (bin/backprop), DIR/backprop-gpu-bundle, or a .tar.xz (DIR,
#      or DIR/backprop-gpu-bundle.tar.xz) unpacked into WORK_DIR (tar + xz, or python's tarfile);
#   2. finds libcublas.so.13 and libcublasLt.so.13, which the bundle leaves out (540 MB): BP_CUBLAS_DIR,
#      the CUDA toolkit's folders, the loader's cache, then the nvidia-cublas wheel of a python
#      (/opt/torch/.venv, or any python3 whose `nvidia` package has it); says which it took;
#   3. finds the driver's libcuda.so.1 (the loader's cache, /usr/local/nvidia/lib64, ...);
#   4. checks that the bundle is self-contained on this machine (gpu_bundle.sh --verify) and that
#      this glibc is as new as the bundle needs.
# Sets BUNDLE_TREE and BUNDLE_LD_PATH (the bundle's lib/, cuBLAS's folder, the driver's folder,
# then LD_LIBRARY_PATH as it was). Returns 1, with a message, when something is missing.

BUNDLE_NAME=backprop-gpu-bundle

# unpack_bundle TARBALL WORK_DIR: prints the unpacked tree
unpack_bundle() {
  local tarball=$1 dest=$2/bundle
  mkdir -p "$dest"
  echo "gpu_check: unpacking $tarball ($(stat -c %s "$tarball") bytes)" >&2
  if command -v xz >/dev/null 2>&1; then
    tar -C "$dest" -xJf "$tarball" || return 1
  else
    python3 - "$tarball" "$dest" <<'PY' || return 1
import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    try:
        t.extractall(sys.argv[2], filter="data")  # python >= 3.12 (and backports): no links out of dest
    except TypeError:
        t.extractall(sys.argv[2])
PY
  fi
  echo "$dest/$BUNDLE_NAME"
}

# find_library NAME: prints "FOLDER<TAB>how it was found" for the first place that has NAME
find_library() {
  local name=$1 dir site
  local -a places=()
  [ -z "${BP_CUBLAS_DIR:-}" ] || places+=("$BP_CUBLAS_DIR")
  for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/lib64 \
    /usr/local/cuda-*/targets/x86_64-linux/lib /usr/local/cuda/lib; do
    places+=("$dir")
  done
  for dir in "${places[@]}"; do
    if [ -e "$dir/$name" ]; then
      printf '%s\t%s\n' "$dir" "a CUDA toolkit folder"
      return
    fi
  done
  dir=$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n && $NF ~ /^\// {print $NF; exit}')
  if [ -n "$dir" ]; then
    printf '%s\t%s\n' "$(dirname "$dir")" "the loader's cache (ldconfig -p)"
    return
  fi
  # The pip wheels (nvidia-cublas): site-packages/nvidia/<cu13 or cublas>/lib/NAME.
  for site in /opt/torch/.venv/lib/python3*/site-packages \
    $(python3 -c 'import nvidia; print(" ".join(nvidia.__path__))' 2>/dev/null); do
    [ -d "$site" ] || continue
    dir=$(find "$site" -maxdepth 4 -name "$name" 2>/dev/null | head -1)
    if [ -n "$dir" ]; then
      printf '%s\t%s\n' "$(dirname "$dir")" "python's nvidia wheels under $site"
      return
    fi
  done
  return 1
}

prepare_bundle() {
  local dir=$1 work=$2 found lib driver_dir need have
  if [ -f "$dir" ]; then
    BUNDLE_TREE=$(unpack_bundle "$dir" "$work") || return 1
  elif [ -x "$dir/bin/backprop" ]; then
    BUNDLE_TREE=$dir
  elif [ -x "$dir/$BUNDLE_NAME/bin/backprop" ]; then
    BUNDLE_TREE=$dir/$BUNDLE_NAME
  elif [ -f "$dir/$BUNDLE_NAME.tar.xz" ]; then
    BUNDLE_TREE=$(unpack_bundle "$dir/$BUNDLE_NAME.tar.xz" "$work") || return 1
  else
    echo "gpu_check: $dir holds no bundle (no bin/backprop, no $BUNDLE_NAME.tar.xz); make one with" \
      "scripts/gpu_bundle.sh where the project builds" >&2
    return 1
  fi
  BUNDLE_TREE=$(cd "$BUNDLE_TREE" && pwd)
  echo "gpu_check: bundle $BUNDLE_TREE ($(sed -n 's/^git commit: *//p' "$BUNDLE_TREE/MANIFEST.txt"))"
  local -a dirs=("$BUNDLE_TREE/lib")
  for lib in libcublasLt.so.13 libcublas.so.13; do
    if ! found=$(find_library "$lib"); then
      echo "gpu_check: $lib is not on this machine (looked in BP_CUBLAS_DIR, /usr/local/cuda*/lib64," \
        "/usr/local/cuda*/targets/x86_64-linux/lib, ldconfig -p, /opt/torch/.venv's and python3's" \
        "nvidia wheels). The bundle leaves cuBLAS out (540 MB); point BP_CUBLAS_DIR at a folder holding" \
        "libcublas.so.13 and libcublasLt.so.13 (CUDA 13)." >&2
      return 1
    fi
    echo "gpu_check: $lib from ${found%%$'\t'*} (${found#*$'\t'})"
    [[ " ${dirs[*]} " == *" ${found%%$'\t'*} "* ]] || dirs+=("${found%%$'\t'*}")
  done
  # The driver: found by the loader itself when its cache has it; else from the usual folders.
  if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
    for driver_dir in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64 \
      ${LD_LIBRARY_PATH:+${LD_LIBRARY_PATH//:/ }}; do
      if [ -e "$driver_dir/libcuda.so.1" ]; then
        echo "gpu_check: libcuda.so.1 (the driver) from $driver_dir"
        [[ " ${dirs[*]} " == *" $driver_dir "* ]] || dirs+=("$driver_dir")
        break
      fi
    done
  fi
  BUNDLE_LD_PATH=$(IFS=:; echo "${dirs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "gpu_check: the bundle's programs run with LD_LIBRARY_PATH=$BUNDLE_LD_PATH"
  need=$(sed -n 's/.*glibc >= \([0-9.]*\).*/\1/p' "$BUNDLE_TREE/MANIFEST.txt")
  have=$(ldd --version 2>/dev/null | head -1 | grep -o '[0-9]*\.[0-9]*$')
  if [ -n "$need" ] && [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
    echo "gpu_check: this machine's glibc $have is older than the $need the bundle was built against;" \
      "build the bundle on an older system, or build here (scripts/gpu_check.sh without --prebuilt)" >&2
    return 1
  fi
  local -a verify_dirs=()
  for lib in "${dirs[@]:1}"; do verify_dirs+=(--lib-dir "$lib"); done
  bash scripts/gpu_bundle.sh --verify "$BUNDLE_TREE" "${verify_dirs[@]}" || return 1
}
