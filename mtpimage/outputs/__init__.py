"""What the tool hands on about an image: the version vector and its diff, the SBOM, the
human-readable reports, the GitHub workflows, cluster job scripts and the enroot export."""
