"""mink for SQL users in Python: the ``mink://`` SQLAlchemy dialect on ADBC's Flight SQL
driver (:mod:`mink_sqlalchemy.dialect`), Apache Superset's engine spec
(:mod:`mink_sqlalchemy.engine_spec`, imported by Superset only), and the SQL it writes
(:mod:`mink_sqlalchemy.expressions`, importable without Superset).

Installing the package registers both through entry points: ``create_engine("mink://...")``
finds the dialect, and Superset lists mink among its databases.
"""

__version__ = "0.1.0"
