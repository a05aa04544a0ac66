"""Retail tasks generated from the seeded database: never hand-typed.

Each task kind has a generator that walks a seeded shuffle of the database rows it can use and
builds the instruction, the user's facts, the gold dialogue and the required outputs from them.
Tasks are drawn round-robin over the kinds, so ``generate_tasks(seed, n)`` is a prefix of
``generate_tasks(seed, m)`` for n < m and any prefix mixes every kind.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Any

from traceops.domains.retail.database import CANCEL_REASONS, DB, days_since, load_database
from traceops.domains.retail.task import KINDS, Task
from traceops.envs.base import AssistantTurn, Call
from traceops.errors import ConfigError

DEFAULT_COUNT = 80
ID_PREFIX = "retail-"

REASON_PHRASES = {"no longer needed": "no longer need it", "ordered by mistake": "ordered it by mistake"}
CONFIRM = "Yes, please go ahead."
OUT_OF_SCOPE = (
    "Can you book me a flight to {place}?",
    "What's the weather going to be like in {place} tomorrow?",
    "Could you recommend a good restaurant in {place}?",
    "What time is it in {place} right now?",
    "Tell me a fun fact about {place}.",
    "How far is {place} from the ocean?",
)
PLACES = ("Paris", "Tokyo", "Lima", "Cairo", "Oslo", "Sydney", "Toronto", "Nairobi", "Lisbon", "Seoul")
NEW_STREETS = ("Harbor Rd", "Sunset Blvd", "Main St", "River Rd", "Hill St", "Park Ave")
NEW_CITIES = (("Miami", "FL"), ("Dallas", "TX"), ("Madison", "WI"), ("Reno", "NV"), ("Tulsa", "OK"))

Draft = dict[str, Any]


def call(name: str, **arguments: Any) -> AssistantTurn:
    """A gold turn making one tool call."""
    return AssistantTurn(calls=(Call(name, arguments),))


def say(text: str) -> AssistantTurn:
    """A gold turn of plain text."""
    return AssistantTurn(content=text)


def describe(options: dict[str, str]) -> str:
    """A variant's options as the customer says them: 'black', 'size 9', '750ml capacity'."""
    (key, value), = options.items()
    if key == "color":
        return value
    if key == "size":
        return f"size {value}"
    return f"{value} {key}"


def money(value: float) -> str:
    """An amount as the agent must state it: two decimals."""
    return f"{value:.2f}"


def _address_args(rng: random.Random) -> dict[str, str]:
    city, state = rng.choice(NEW_CITIES)
    return {"address1": f"{rng.randint(10, 9999)} {rng.choice(NEW_STREETS)}", "city": city, "state": state,
            "zip": f"{rng.randint(10000, 99999)}"}


def _say_address(address: dict[str, str]) -> str:
    return f"{address['address1']}, {address['city']}, {address['state']} {address['zip']}"


def _orders(db: DB, rng: random.Random, status: str | None = None) -> list[dict[str, Any]]:
    rows = [o for _, o in sorted(db["orders"].items()) if status is None or o["status"] == status]
    rng.shuffle(rows)
    return rows


def _email(db: DB, order: dict[str, Any]) -> str:
    return db["users"][order["user_id"]]["email"]


def _returnable(order: dict[str, Any]) -> bool:
    return order["status"] == "delivered" and days_since(order["delivered_date"]) <= 30


# -- one generator per kind: each yields task drafts (a Task's fields without id and kind) -----------

def _order_status(db: DB, rng: random.Random) -> Iterator[Draft]:
    for order in _orders(db, rng):
        oid, email = order["order_id"], _email(db, order)
        yield {"instruction": f"Hi, what's the status of my order {oid}?",
               "facts": {"email": email},
               "turns": (say("Sure, I can help. Could you please tell me the email address on your account?"),
                         call("find_user_by_email", email=email), call("get_order_details", order_id=oid),
                         say(f"Your order {oid} is currently {order['status']}.")),
               "outputs": (order["status"],)}


def _order_total(db: DB, rng: random.Random) -> Iterator[Draft]:
    for order in _orders(db, rng):
        oid, email = order["order_id"], _email(db, order)
        yield {"instruction": f"Hello, my email is {email}. How much did I pay in total for order {oid}?",
               "facts": {"email": email},
               "turns": (call("find_user_by_email", email=email), call("get_order_details", order_id=oid),
                         say(f"The total of order {oid} was {money(order['total'])} dollars.")),
               "outputs": (money(order["total"]),)}


def _product_price(db: DB, rng: random.Random) -> Iterator[Draft]:
    rows = [(pid, sku) for pid, p in sorted(db["products"].items()) for sku in sorted(p["variants"])]
    rng.shuffle(rows)
    for pid, sku in rows:
        product = db["products"][pid]
        variant = product["variants"][sku]
        what = f"{product['name']} in {describe(variant['options'])}"
        yield {"instruction": f"How much does the {what} cost right now?",
               "turns": (call("list_products"), call("get_product_details", product_id=pid),
                         say(f"The {what} costs {money(variant['price'])} dollars.")),
               "outputs": (money(variant["price"]),)}


def _cancel_order(db: DB, rng: random.Random) -> Iterator[Draft]:
    for order in _orders(db, rng, "pending"):
        oid, email = order["order_id"], _email(db, order)
        reason = rng.choice(CANCEL_REASONS)
        yield {"instruction": f"Hi, I'm {email}. Please cancel my order {oid}; I {REASON_PHRASES[reason]}.",
               "facts": {"email": email, "confirm": CONFIRM},
               "turns": (call("find_user_by_email", email=email), call("get_order_details", order_id=oid),
                         call("cancel_pending_order", order_id=oid, reason=reason),
                         say(f"Order {oid} is cancelled; {money(order['total'])} dollars will be refunded "
                             "to your original payment method.")),
               }


def _modify_order_address(db: DB, rng: random.Random) -> Iterator[Draft]:
    for order in _orders(db, rng, "pending"):
        oid, email = order["order_id"], _email(db, order)
        address = _address_args(rng)
        yield {"instruction": f"My email is {email}. Please ship my order {oid} to {_say_address(address)} "
                              "instead.",
               "facts": {"email": email, "confirm": CONFIRM},
               "turns": (call("find_user_by_email", email=email), call("get_order_details", order_id=oid),
                         call("modify_pending_order_address", order_id=oid, **address),
                         say(f"Order {oid} will now ship to {_say_address(address)}.")),
               }


def _update_address(db: DB, rng: random.Random) -> Iterator[Draft]:
    users = [u for _, u in sorted(db["users"].items())]
    rng.shuffle(users)
    seen: set[tuple[str, str, str]] = set()
    for user in users:
        first, last, code = user["name"]["first_name"], user["name"]["last_name"], user["address"]["zip"]
        if (first, last, code) in seen:  # the name and zip must identify one customer
            continue
        seen.add((first, last, code))
        address = _address_args(rng)
        yield {"instruction": f"Hi, I'm {first} {last}, zip code {code}. I have moved: please update my "
                              f"address to {_say_address(address)}.",
               "facts": {"name_zip": f"{first} {last}, zip {code}", "confirm": CONFIRM},
               "turns": (call("find_user_by_name_zip", first_name=first, last_name=last, zip=code),
                         call("update_user_address", user_id=user["user_id"], **address),
                         say(f"Your address is now {_say_address(address)}.")),
               }


def _transfer_human(db: DB, rng: random.Random) -> Iterator[Draft]:
    for order in _orders(db, rng, "delivered"):
        oid, email = order["order_id"], _email(db, order)
        name = order["items"][0]["name"]
        yield {"instruction": f"My email is {email}. The {name} from order {oid} arrived broken and I want "
                              "to file a complaint with a human agent.",
               "facts": {"email": email, "confirm": CONFIRM},
               "turns": (call("find_user_by_email", email=email), call("get_order_details", order_id=oid),
                         call("transfer_to_human_agents",
                              summary=f"Customer reports the {name} from order {oid} arrived broken and "
                                      "wants to file a complaint."),
                         say("I have transferred you to a human agent who will handle your complaint.")),
               }


def _return_items(db: DB, rng: random.Random) -> Iterator[Draft]:
    for order in _orders(db, rng, "delivered"):
        if not _returnable(order):
            continue
        user = db["users"][order["user_id"]]
        # The product must appear in no other order of the customer, so "the X" is unambiguous.
        elsewhere = {i["name"] for oid in user["orders"] if oid != order["order_id"]
                     for i in db["orders"][oid]["items"]}
        items = [i for i in order["items"] if i["name"] not in elsewhere]
        if not items:
            continue
        item = rng.choice(items)
        oid = order["order_id"]
        yield {"instruction": f"Hi, my email is {user['email']}. I'd like to return the {item['name']} "
                              "I received recently.",
               "facts": {"email": user["email"], "confirm": CONFIRM, "order_id": f"I don't remember it, "
                         f"it is the order with the {item['name']}."},
               "turns": (call("find_user_by_email", email=user["email"]),
                         call("list_user_orders", user_id=user["user_id"]),
                         call("get_order_details", order_id=oid),
                         call("return_delivered_order_items", order_id=oid, item_ids=[item["item_id"]]),
                         say(f"The return of your {item['name']} is requested; {money(item['price'])} "
                             "dollars will be refunded to your original payment method.")),
               "outputs": (money(item["price"]),)}


def _variants(db: DB, item: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    variants = db["products"][item["product_id"]]["variants"]
    return [(sku, v) for sku, v in sorted(variants.items()) if sku != item["sku"]]


def _exchange_item(db: DB, rng: random.Random) -> Iterator[Draft]:
    for order in _orders(db, rng, "delivered"):
        if not _returnable(order):
            continue
        for item in order["items"]:
            stocked = [(sku, v) for sku, v in _variants(db, item) if v["stock"] > 0]
            if not stocked:
                continue
            sku, variant = rng.choice(stocked)
            oid, email = order["order_id"], _email(db, order)
            old, new = describe(item["options"]), describe(variant["options"])
            yield {"instruction": f"My email is {email}. I want to exchange the {item['name']} ({old}) from "
                                  f"order {oid} for the {new} one.",
                   "facts": {"email": email, "confirm": CONFIRM},
                   "turns": (call("find_user_by_email", email=email), call("get_order_details", order_id=oid),
                             call("get_product_details", product_id=item["product_id"]),
                             call("exchange_delivered_order_items", order_id=oid, item_id=item["item_id"],
                                  new_sku=sku),
                             say(f"Your exchange of the {item['name']} for the {new} one is requested.")),
                   }
            break


def _cancel_two_orders(db: DB, rng: random.Random) -> Iterator[Draft]:
    users = [u for _, u in sorted(db["users"].items())]
    rng.shuffle(users)
    for user in users:
        pending = [oid for oid in user["orders"] if db["orders"][oid]["status"] == "pending"]
        if len(pending) != 2:
            continue
        first, second = pending
        yield {"instruction": f"Hi, it's {user['email']}. Please cancel all of my pending orders, I ordered "
                              "them by mistake.",
               "facts": {"email": user["email"], "confirm": CONFIRM},
               "turns": (call("find_user_by_email", email=user["email"]),
                         call("list_user_orders", user_id=user["user_id"]),
                         call("cancel_pending_order", order_id=first, reason="ordered by mistake"),
                         call("cancel_pending_order", order_id=second, reason="ordered by mistake"),
                         say(f"Both pending orders, {first} and {second}, are cancelled.")),
               }


def _refuse_cancel_delivered(db: DB, rng: random.Random) -> Iterator[Draft]:
    for order in _orders(db, rng, "delivered"):
        oid, email = order["order_id"], _email(db, order)
        reason = rng.choice(CANCEL_REASONS)
        yield {"instruction": f"Hi, I'm {email}. Cancel order {oid} please, I {REASON_PHRASES[reason]}.",
               "facts": {"email": email, "confirm": CONFIRM},
               "turns": (call("find_user_by_email", email=email), call("get_order_details", order_id=oid),
                         say(f"I'm sorry, but order {oid} has already been delivered, so it can no longer "
                             "be cancelled: only pending orders can be. You can return its items within "
                             "30 days of delivery instead.")),
               "outputs": ("delivered",),
               "forbidden": Call("cancel_pending_order", {"order_id": oid, "reason": reason})}


def _refuse_late_return(db: DB, rng: random.Random) -> Iterator[Draft]:
    for order in _orders(db, rng, "delivered"):
        if _returnable(order):
            continue
        oid, email = order["order_id"], _email(db, order)
        item = rng.choice(order["items"])
        yield {"instruction": f"My email is {email}. I want to return the {item['name']} from order {oid}.",
               "facts": {"email": email, "confirm": CONFIRM},
               "turns": (call("find_user_by_email", email=email), call("get_order_details", order_id=oid),
                         say(f"I'm sorry, but order {oid} was delivered on {order['delivered_date']}, more "
                             "than 30 days ago, so its items can no longer be returned.")),
               "outputs": ("30 days",),
               "forbidden": Call("return_delivered_order_items", {"order_id": oid,
                                                                  "item_ids": [item["item_id"]]})}


def _refuse_modify_processed(db: DB, rng: random.Random) -> Iterator[Draft]:
    for order in _orders(db, rng, "processed"):
        oid, email = order["order_id"], _email(db, order)
        address = _address_args(rng)
        yield {"instruction": f"My email is {email}. Please change the shipping address of order {oid} to "
                              f"{_say_address(address)}.",
               "facts": {"email": email, "confirm": CONFIRM},
               "turns": (call("find_user_by_email", email=email), call("get_order_details", order_id=oid),
                         say(f"I'm sorry, but order {oid} is already processed and being shipped, so its "
                             "address can no longer be changed.")),
               "outputs": ("processed",),
               "forbidden": Call("modify_pending_order_address", {"order_id": oid, **address})}


def _recover_order_id(db: DB, rng: random.Random) -> Iterator[Draft]:
    for order in _orders(db, rng, "pending"):
        oid, email = order["order_id"], _email(db, order)
        wrong = oid[:-1]  # the customer drops a digit: the tool rejects the id's format
        reason = rng.choice(CANCEL_REASONS)
        yield {"instruction": f"Hi, my email is {email}. Please cancel order {wrong}, I "
                              f"{REASON_PHRASES[reason]}.",
               "facts": {"email": email, "order_id": f"Sorry, the order id is {oid}.", "confirm": CONFIRM},
               "turns": (call("find_user_by_email", email=email), call("get_order_details", order_id=wrong),
                         say(f"I couldn't find order {wrong}: order ids have seven digits after '#W'. "
                             "Could you double-check the order id?"),
                         call("get_order_details", order_id=oid),
                         call("cancel_pending_order", order_id=oid, reason=reason),
                         say(f"Order {oid} is cancelled; {money(order['total'])} dollars will be refunded "
                             "to your original payment method.")),
               "error_turn": 1}


def _recover_email(db: DB, rng: random.Random) -> Iterator[Draft]:
    emails = {u["email"] for u in db["users"].values()}
    for order in _orders(db, rng):
        oid, email = order["order_id"], _email(db, order)
        local, domain = email.split("@")
        cut = rng.randrange(len(local))
        typo = f"{local[:cut]}{local[cut + 1:]}@{domain}"  # a dropped letter
        if typo in emails:
            continue
        yield {"instruction": f"Hi, my email is {typo}. What's the status of order {oid}?",
               "facts": {"email": f"Oh, sorry: it's {email}."},
               "turns": (call("find_user_by_email", email=typo),
                         say("I couldn't find an account with that email. Could you double-check your email "
                             "address?"),
                         call("find_user_by_email", email=email), call("get_order_details", order_id=oid),
                         say(f"Your order {oid} is currently {order['status']}.")),
               "outputs": (order["status"],),
               "error_turn": 0}


def _recover_out_of_stock(db: DB, rng: random.Random) -> Iterator[Draft]:
    for order in _orders(db, rng, "delivered"):
        if not _returnable(order):
            continue
        for item in order["items"]:
            others = _variants(db, item)
            empty = [(sku, v) for sku, v in others if v["stock"] <= 0]
            stocked = [(sku, v) for sku, v in others if v["stock"] > 0]
            if not empty or not stocked:
                continue
            (gone, gone_v), (alt, alt_v) = rng.choice(empty), rng.choice(stocked)
            oid, email = order["order_id"], _email(db, order)
            old, want, fallback = (describe(item["options"]), describe(gone_v["options"]),
                                   describe(alt_v["options"]))
            yield {"instruction": f"My email is {email}. I'd like to exchange the {item['name']} ({old}) "
                                  f"from order {oid} for the {want} one. If that one is not available, the "
                                  f"{fallback} one is fine too.",
                   "facts": {"email": email, "confirm": CONFIRM},
                   "turns": (call("find_user_by_email", email=email), call("get_order_details", order_id=oid),
                             call("exchange_delivered_order_items", order_id=oid, item_id=item["item_id"],
                                  new_sku=gone),
                             call("get_product_details", product_id=item["product_id"]),
                             call("exchange_delivered_order_items", order_id=oid, item_id=item["item_id"],
                                  new_sku=alt),
                             say(f"The {want} one is out of stock, so I requested the exchange of your "
                                 f"{item['name']} for the {fallback} one.")),
                   "error_turn": 2}
            break


def _out_of_scope(db: DB, rng: random.Random) -> Iterator[Draft]:
    rows = [(template, place) for template in OUT_OF_SCOPE for place in PLACES]
    rng.shuffle(rows)
    for template, place in rows:
        yield {"instruction": template.format(place=place),
               "turns": (say("I'm sorry, but I can only help with orders and products from our store."),),
               "no_tools": True}


GENERATORS: dict[str, Callable[[DB, random.Random], Iterator[Draft]]] = {
    "order_status": _order_status,
    "order_total": _order_total,
    "product_price": _product_price,
    "cancel_order": _cancel_order,
    "modify_order_address": _modify_order_address,
    "update_address": _update_address,
    "transfer_human": _transfer_human,
    "return_items": _return_items,
    "exchange_item": _exchange_item,
    "cancel_two_orders": _cancel_two_orders,
    "refuse_cancel_delivered": _refuse_cancel_delivered,
    "refuse_late_return": _refuse_late_return,
    "refuse_modify_processed": _refuse_modify_processed,
    "recover_order_id": _recover_order_id,
    "recover_email": _recover_email,
    "recover_out_of_stock": _recover_out_of_stock,
    "out_of_scope": _out_of_scope,
}
assert tuple(GENERATORS) == KINDS, "every task kind needs exactly one generator, in KINDS order"


@lru_cache(maxsize=4)
def _all_tasks(seed: int) -> tuple[Task, ...]:
    """Every task the seed's database supports, round-robin over the kinds."""
    db = load_database(seed)
    streams = {kind: make(db, random.Random(f"retail-tasks:{seed}:{kind}"))
               for kind, make in GENERATORS.items()}
    tasks: list[Task] = []
    seen: set[str] = set()
    while streams:
        for kind in list(streams):
            draft = next(streams[kind], None)
            if draft is None:
                del streams[kind]
                continue
            if draft["instruction"] in seen:  # the planted agent keys episodes by instruction
                continue
            seen.add(draft["instruction"])
            tasks.append(Task(id=f"{ID_PREFIX}{len(tasks):04d}", kind=kind, **draft))
    return tuple(tasks)


def generate_tasks(seed: int = 0, count: int | None = DEFAULT_COUNT) -> list[Task]:
    """The first ``count`` tasks of the seed (all of them when ``count`` is None)."""
    tasks = _all_tasks(seed)
    if count is None:
        return list(tasks)
    if count < 0 or count > len(tasks):
        raise ConfigError(f"retail tasks: asked for {count}, but seed {seed} supports 0 to {len(tasks)}; "
                          "ask for fewer tasks")
    return list(tasks[:count])


def get_task(seed: int, task_id: str) -> Task:
    """The task with ``task_id``; ConfigError naming the valid ids when there is none."""
    tasks = _all_tasks(seed)
    try:
        index = int(task_id[len(ID_PREFIX):]) if task_id.startswith(ID_PREFIX) else -1
    except ValueError:
        index = -1
    if 0 <= index < len(tasks) and tasks[index].id == task_id:
        return tasks[index]
    raise ConfigError(f"unknown retail task id {task_id!r}; valid ids are {tasks[0].id} to {tasks[-1].id} "
                      f"(seed {seed}: {len(tasks)} tasks, list them with get_domain('retail').tasks())")
