"""`bass build-kernels`: compile the few-row CUDA kernel (kernels/cuda/skinny_gemm.cu) into the
kernel cache now, for this machine's GPUs or named architectures, instead of at the first model
load: a node's set-up script, an image built with the CUDA compiler, or to see nvcc's errors."""

from __future__ import annotations

import click


@click.command("build-kernels")
@click.option("--arch", "archs", multiple=True, metavar="SM",
              help="Compute capability times 10, e.g. 90 for Hopper; repeatable [this machine's GPUs].")
@click.option("--force", is_flag=True, help="Rebuild where the cache already has the library.")
def build_kernels_command(archs: tuple[str, ...], force: bool) -> None:
    """Compile the few-row CUDA kernel into the kernel cache (~/.cache/bass/kernels, or
    BASS_KERNEL_CACHE) and print where each library is."""
    from bass.kernels import cuda_skinny

    for arch in archs:
        if not arch.isdigit() or int(arch) < 80:
            raise click.BadParameter(f"{arch!r}: a compute capability times 10 of 80 or more (bf16 tensor cores), "
                                     "e.g. 80, 89, 90", param_hint="--arch")
    if not archs:
        import torch

        if not torch.cuda.is_available():
            raise click.UsageError("no CUDA GPU here: name the architectures to build for with --arch (e.g. --arch 90)")
        archs = tuple(sorted({f"{major}{minor}" for major, minor in
                              (torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count()))}))
    nvcc = cuda_skinny.find_nvcc()
    if nvcc is None:
        raise click.ClickException("no nvcc on PATH or under CUDA_HOME: install the CUDA toolkit's compiler, or "
                                   "run without the kernel (the models keep their Triton / cuBLAS products)")
    for arch in archs:
        target = cuda_skinny.cache_dir() / cuda_skinny.library_name(arch)
        if target.exists() and not force:
            click.echo(f"sm_{arch}: {target} (already built)")
            continue
        click.echo(f"sm_{arch}: compiling {target.name} (about 30 s)...", err=True)
        error = cuda_skinny.build_library(nvcc, arch, target)
        if error is not None:
            raise click.ClickException(f"sm_{arch}: nvcc failed:\n{error}")
        click.echo(f"sm_{arch}: {target}")


COMMANDS = [build_kernels_command]
