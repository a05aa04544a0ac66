"""The retail database: users, products with variants, orders and support tickets, generated from a seed.

The database is plain JSON-able dicts keyed by id, so its canonical JSON (``traceops.hashing``) is the
state the verifier compares. Generation is a pure function of the seed: same seed, same bytes.
"""

from __future__ import annotations

import copy
import random
from functools import lru_cache
from typing import Any

DB = dict[str, Any]

# "Today" for the policy's return window; fixed so verification never depends on the clock.
# Dates use 30-day months from 2006-01-01 so they stay exact and simple; only differences matter.
TODAY_ORDINAL = 20 * 360 + 10 * 30 + 29
TODAY = "2026-11-30"

FIRST_NAMES = ("Ava", "Liam", "Mia", "Noah", "Zoe", "Omar", "Ines", "Yuki", "Ravi", "Lena", "Hugo", "Nora",
               "Ivan", "Sara", "Theo", "Maya", "Kofi", "Elsa", "Jude", "Rosa")
LAST_NAMES = ("Garcia", "Smith", "Kim", "Patel", "Muller", "Rossi", "Silva", "Chen", "Novak", "Haddad",
              "Okafor", "Larsen", "Moreau", "Tanaka", "Costa", "Walsh")
STREETS = ("Maple Ave", "Oak St", "Pine Rd", "Cedar Ln", "Elm St", "Birch Way", "Willow Dr", "Lake Blvd")
CITIES = (("Austin", "TX"), ("Denver", "CO"), ("Seattle", "WA"), ("Boston", "MA"), ("Chicago", "IL"),
          ("Phoenix", "AZ"), ("Portland", "OR"), ("Atlanta", "GA"))
PRODUCTS = (
    ("Wireless Headphones", {"color": ("black", "white", "blue")}, 79.0),
    ("Running Shoes", {"size": ("8", "9", "10", "11")}, 95.0),
    ("Water Bottle", {"capacity": ("500ml", "750ml", "1l")}, 18.0),
    ("Desk Lamp", {"color": ("black", "silver")}, 42.0),
    ("Backpack", {"color": ("green", "grey", "navy")}, 64.0),
    ("Mechanical Keyboard", {"switch": ("linear", "tactile", "clicky")}, 120.0),
    ("Yoga Mat", {"thickness": ("4mm", "6mm")}, 35.0),
    ("Coffee Maker", {"capacity": ("4 cups", "8 cups", "12 cups")}, 89.0),
    ("Smart Watch", {"color": ("black", "rose", "silver")}, 199.0),
    ("Rain Jacket", {"size": ("S", "M", "L", "XL")}, 110.0),
    ("Electric Kettle", {"color": ("white", "steel")}, 39.0),
    ("Bluetooth Speaker", {"color": ("red", "black", "teal")}, 58.0),
    ("Office Chair", {"color": ("black", "grey")}, 240.0),
    ("Sunglasses", {"style": ("aviator", "round", "square")}, 49.0),
    ("Gaming Mouse", {"color": ("black", "white")}, 45.0),
    ("Camping Tent", {"size": ("2 person", "4 person")}, 175.0),
)
STATUSES = ("pending", "processed", "delivered", "cancelled")
CANCEL_REASONS = ("no longer needed", "ordered by mistake")
ORDER_STATUS_WEIGHTS = (0.35, 0.15, 0.4, 0.1)


def order_id(number: int) -> str:
    """The canonical order id format, ``#W`` and seven digits."""
    return f"#W{number:07d}"


def day_to_date(day: int) -> str:
    """A day offset (0 = TODAY) as an ISO date, with 30-day months so dates stay simple and exact."""
    total = TODAY_ORDINAL + day
    year, rest = divmod(total, 360)
    month, dom = divmod(rest, 30)
    return f"{2006 + year:04d}-{month + 1:02d}-{dom + 1:02d}"


def _money(value: float) -> float:
    return round(value + 1e-9, 2)


def _products(rng: random.Random) -> dict[str, Any]:
    products: dict[str, Any] = {}
    sku_number = 1000
    for index, (name, options, base) in enumerate(PRODUCTS):
        product_id = f"prod_{index + 1:03d}"
        (option_name, values), = options.items()
        variants = {}
        for value in values:
            sku_number += rng.randint(1, 9)
            sku = f"sku_{sku_number:05d}"
            variants[sku] = {
                "sku": sku,
                "options": {option_name: value},
                "price": _money(base * rng.uniform(0.9, 1.15)),
                # Roughly one variant in five is out of stock: the out-of-stock tasks need some.
                "stock": 0 if rng.random() < 0.2 else rng.randint(1, 40),
            }
        products[product_id] = {"product_id": product_id, "name": name, "variants": variants}
    return products


def _address(rng: random.Random) -> dict[str, str]:
    city, state = rng.choice(CITIES)
    return {
        "address1": f"{rng.randint(10, 9999)} {rng.choice(STREETS)}",
        "city": city,
        "state": state,
        "zip": f"{rng.randint(10000, 99999)}",
    }


def generate_database(seed: int = 0, n_users: int = 120) -> DB:
    """A fresh retail database for ``seed``: users, products, orders and an empty ticket list."""
    rng = random.Random(f"retail-db:{seed}")
    products = _products(rng)
    product_ids = sorted(products)
    users: dict[str, Any] = {}
    orders: dict[str, Any] = {}
    order_numbers = rng.sample(range(1_000_000, 9_999_999), n_users * 6)
    for index in range(n_users):
        user_id = f"user_{index + 1:04d}"
        first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
        methods: dict[str, Any] = {}
        for kind in rng.sample(("credit_card", "paypal", "gift_card"), rng.randint(1, 3)):
            method_id = f"{kind}_{rng.randint(1000000, 9999999)}"
            detail: dict[str, Any] = {"kind": kind}
            if kind == "credit_card":
                detail["last_four"] = f"{rng.randint(0, 9999):04d}"
            elif kind == "gift_card":
                detail["balance"] = _money(rng.uniform(10, 300))
            methods[method_id] = detail
        user = {
            "user_id": user_id,
            "name": {"first_name": first, "last_name": last},
            "email": f"{first.lower()}.{last.lower()}{index + 1}@example.com",
            "address": _address(rng),
            "payment_methods": methods,
            "orders": [],
        }
        for _ in range(rng.randint(1, 5)):
            oid = order_id(order_numbers.pop())
            status = rng.choices(STATUSES, weights=ORDER_STATUS_WEIGHTS)[0]
            items = []
            for position, product_id in enumerate(rng.sample(product_ids, rng.randint(1, 3))):
                product = products[product_id]
                sku = rng.choice(sorted(product["variants"]))
                variant = product["variants"][sku]
                items.append({
                    "item_id": f"item_{oid[2:]}_{position + 1}",
                    "product_id": product_id,
                    "name": product["name"],
                    "sku": sku,
                    "options": dict(variant["options"]),
                    "price": variant["price"],
                    "state": "ordered",
                })
            placed = -rng.randint(2, 90)
            order = {
                "order_id": oid,
                "user_id": user_id,
                "status": status,
                "items": items,
                "address": dict(user["address"]),
                "payment_method_id": rng.choice(sorted(methods)),
                "total": _money(sum(item["price"] for item in items)),
                "placed_date": day_to_date(placed),
                "delivered_date": day_to_date(min(-1, placed + rng.randint(1, 60))) if status == "delivered"
                else None,
                "cancel_reason": None,
                "refunds": [],
            }
            orders[oid] = order
            user["orders"].append(oid)
        users[user_id] = user
    return {"users": users, "products": products, "orders": orders, "tickets": []}


@lru_cache(maxsize=4)
def pristine_database(seed: int = 0) -> DB:
    """The seed's database, generated once per process and shared: never mutate it.

    Episodes start from a shallow copy of it and copy a table on their first write to it
    (``RetailTools._write_row``), so lookups cost nothing and writes copy only what they touch.
    """
    return generate_database(seed)


def load_database(seed: int = 0) -> DB:
    """A private deep copy of the seed's database."""
    return copy.deepcopy(pristine_database(seed))


def days_since(date: str) -> int:
    """Days from an ISO date written by ``day_to_date`` to TODAY."""
    year, month, dom = (int(part) for part in date.split("-"))
    total = (year - 2006) * 360 + (month - 1) * 30 + (dom - 1)
    return TODAY_ORDINAL - total
