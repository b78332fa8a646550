"""The package list, with one mapping that pyproject.toml cannot say beside ``packages.find``:
``alembic/`` (the migrations' home at the top of the checkout, where ``alembic -c alembic.ini``
runs them) is shipped inside the package as ``collector.storage.migrations``, so a wheel and a
``pip install --target`` carry them with nothing beside the package (collector/storage/migrate.py)."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["collector*"]), "collector.storage.migrations"],
    package_dir={"collector.storage.migrations": "alembic"},
)
