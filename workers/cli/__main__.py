"""`python -m workers.cli …` runs the `utxo` command line."""

from workers.cli import main

if __name__ == "__main__":
    main()
