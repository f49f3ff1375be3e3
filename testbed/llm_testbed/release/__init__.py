"""``make release``: everything a platform team installs, built into one folder for the project's version.

``dist/release/<version>/`` holds the chart (``helm package``), one YAML of every CRD, the Python packages
(wheel and sdist of the project and of the runtime library), both images tagged with the version in the
image builder's podman storage (optionally saved as OCI archives), a CycloneDX SBOM per package and per
image, and ``SHA256SUMS``. Progress goes to stderr, the folder's contents with their sizes to stdout.
"""
