"""``python -m pykka_delivery.cli``: the ``pykka-delivery`` command."""

from pykka_delivery.cli import main

main()
