"""Entry point Pulumi runs for the park-gke component package (PulumiPlugin.yaml)."""

from park_gke.provider import main

if __name__ == "__main__":
    main()
