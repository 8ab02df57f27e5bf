"""`python -m bass.cli`: the `bass` command (bass/app/cli/) under the module name that the
Makefile, the image, the manifests and the GPU scripts run."""

from bass.app.cli import main

if __name__ == "__main__":
    main()
