"""``pyverbs.qp``: queue pairs and their attribute objects."""

from softverbs.verbs.qp import (
    QP,
    DataBuffer,
    QPAttr,
    QPCap,
    QPEx,
    QPInitAttr,
    QPInitAttrEx,
)

__all__ = ["QP", "DataBuffer", "QPAttr", "QPCap", "QPEx", "QPInitAttr", "QPInitAttrEx"]
