import json

from django.db import connection, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from .tasks import send_receipt, total


class PaymentDeclined(Exception):
    pass


@csrf_exempt
def create_order(request: HttpRequest) -> JsonResponse:
    order = json.loads(request.body)
    try:
        with transaction.atomic():  # the order and its jobs commit (or roll back) together
            with connection.cursor() as cur:
                cur.execute("INSERT INTO shop_orders (id) VALUES (%s)", [order["id"]])
            receipt = send_receipt.enqueue(order["id"], order["email"])
            summed = total.enqueue(order["id"], order["lines"])
            if order.get("declined"):
                raise PaymentDeclined  # rolls back: these jobs are never sent
    except PaymentDeclined:
        return JsonResponse({"error": "payment declined"}, status=402)
    return JsonResponse({"receipt": receipt.id, "total": summed.id}, status=201)
